"""``Task.batch_job``: the RQ job that carries a task's first delivery together with others of its batch.

A column with a constant default: PostgreSQL adds it without rewriting the table (11 and newer), so the
migration takes a moment whatever the number of tasks.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tasks", "0021_attempt_error_code_partial")]

    operations = [
        migrations.AddField(
            model_name="task",
            name="batch_job",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
    ]
