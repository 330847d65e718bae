"""Traces (tasks.observability.tracing): the W3C trace context a task's runs continue, a NULL jsonb column added without
rewriting or scanning the table (PostgreSQL stores no value for the existing rows)."""

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
