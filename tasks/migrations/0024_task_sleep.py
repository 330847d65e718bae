"""Sleep steps (``Pipeline.sleep``): a task waits for "time"; ``wait_until`` keeps the end of the sleep its current
step began (a nullable column: no rewrite of the table)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0023_task_waiting"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="wait_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="task",
            name="wait_for",
            field=models.CharField(
                blank=True,
                choices=[("", "nothing"), ("start", "its start time"), ("time", "a time")],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
    ]
