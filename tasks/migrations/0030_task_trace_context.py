"""The trace a task belongs to (tasks.tracing): a NULL jsonb column, added without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0029_task_attributes_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="trace_context",
            field=models.JSONField(blank=True, null=True, verbose_name="trace context"),
        ),
    ]
