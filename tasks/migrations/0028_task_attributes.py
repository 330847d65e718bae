"""Search attributes (tasks.pipelines.attributes): a NULL jsonb column of the task, added without rewriting or scanning
the table (PostgreSQL stores no value for the existing rows)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0027_attempt_log"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="attributes",
            field=models.JSONField(blank=True, null=True, verbose_name="search attributes"),
        ),
    ]
