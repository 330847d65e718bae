"""Wait steps (``Pipeline.wait``): a task waits for a "signal"; the signals sent to tasks, one per task and name."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0024_task_sleep"),
    ]

    operations = [
        migrations.AlterField(
            model_name="task",
            name="wait_for",
            field=models.CharField(
                blank=True,
                choices=[("", "nothing"), ("start", "its start time"), ("time", "a time"), ("signal", "a signal")],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="Signal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=100)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("payload_fingerprint", models.CharField(max_length=64)),
                ("idempotency_key", models.CharField(blank=True, default="", max_length=255)),
                ("sent_by", models.CharField(blank=True, default="", max_length=200)),
                ("received_at", models.DateTimeField(auto_now_add=True)),
                (
                    "task",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="signals",
                        to="tasks.task",
                    ),
                ),
            ],
            options={
                "verbose_name": "signal",
                "verbose_name_plural": "signals",
                "constraints": [models.UniqueConstraint(fields=("task", "name"), name="signal_unique_name")],
            },
        ),
    ]
