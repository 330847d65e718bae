"""The WAITING state: a task submitted to start later waits in it (``wait_for`` "start", its time in retry_at)
instead of QUEUED with the hold "start_time", which goes. Rows held that way become WAITING, in one statement
each way (a rolled-back migration puts them back)."""

import django_fsm
from django.db import migrations, models

FORWARD = (
    "UPDATE tasks_task SET state = 'waiting', wait_for = 'start', hold = '' "
    "WHERE state = 'queued' AND hold = 'start_time'"
)
BACKWARD = (
    "UPDATE tasks_task SET state = 'queued', hold = 'start_time', wait_for = '' "
    "WHERE state = 'waiting' AND wait_for = 'start'"
)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0022_task_batch_job"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="wait_for",
            field=models.CharField(
                blank=True,
                choices=[("", "nothing"), ("start", "its start time")],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="hold",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "not held"),
                    ("paused", "pipeline paused"),
                    ("concurrency", "concurrency limit"),
                    ("rate", "rate limit"),
                ],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="state",
            field=django_fsm.FSMField(
                choices=[
                    ("queued", "queued"),
                    ("running", "running"),
                    ("retry_scheduled", "retry scheduled"),
                    ("waiting", "waiting"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("compensating", "compensating"),
                    ("compensated", "compensated"),
                    ("compensation_failed", "compensation failed"),
                    ("cancelled", "cancelled"),
                ],
                default="queued",
                max_length=32,
                protected=True,
            ),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
