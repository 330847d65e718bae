"""The dead-letter record moves from the console (dlq.DLQItem) to the engine (tasks.DeadLetter).

State only: the table keeps its name (``dlq_dlqitem``), its rows, indexes and
constraints, so no data moves. On a database where the console's migrations
created it, this changes nothing in the database (``dlq.0007`` runs before
this one when the console is installed). A deployment without the console
has no such table yet: it is created here, from the model.
"""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "dlq_dlqitem"


def create_table_if_missing(apps, schema_editor):
    if TABLE not in schema_editor.connection.introspection.table_names():
        schema_editor.create_model(apps.get_model("tasks", "DeadLetter"))


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0007_step_progress_without_index_writes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DeadLetter",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("pipeline", models.CharField(max_length=100)),
                        ("reason_code", models.CharField(max_length=40)),
                        ("reason", models.TextField(help_text="human-readable explanation of the failure")),
                        ("error_code", models.CharField(blank=True, default="", max_length=100)),
                        ("error_class", models.CharField(blank=True, default="", max_length=200)),
                        ("error_message", models.TextField(blank=True, default="")),
                        ("failing_step", models.CharField(blank=True, default="", max_length=100)),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        ("input_snapshot", models.JSONField(default=dict, help_text="task input with secrets redacted")),
                        ("fingerprint", models.CharField(help_text="pipeline:step:error code, for grouping", max_length=300)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("open", "open"),
                                    ("retrying", "retrying"),
                                    ("compensating", "compensating"),
                                    ("compensated", "compensated"),
                                    ("resolved", "resolved"),
                                ],
                                default="open",
                                max_length=20,
                            ),
                        ),
                        ("compensation_error", models.TextField(blank=True, default="")),
                        ("resolution_code", models.CharField(blank=True, default="", max_length=40)),
                        ("resolution_note", models.TextField(blank=True, default="")),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        ("resolved_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "task",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT, related_name="dlq_items", to="tasks.task"
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "dead-letter item",
                        "verbose_name_plural": "dead-letter queue",
                        "db_table": TABLE,
                        "ordering": ["-created_at"],
                        "default_permissions": (),
                        "indexes": [
                            models.Index(fields=["status", "-created_at"], name="dlq_status_created_idx"),
                            models.Index(fields=["-created_at"], name="dlq_created_idx"),
                            models.Index(fields=["error_class", "status"], name="dlq_error_class_status_idx"),
                            models.Index(fields=["failing_step", "status"], name="dlq_step_status_idx"),
                            models.Index(fields=["resolved_at"], name="dlq_resolved_idx"),
                            models.Index(fields=["pipeline", "status"], name="dlq_pipeline_status_idx"),
                            models.Index(fields=["fingerprint", "status"], name="dlq_fingerprint_status_idx"),
                            models.Index(fields=["reason_code", "status"], name="dlq_reason_status_idx"),
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("status", "resolved"), _negated=True),
                                fields=("task",),
                                name="dlq_one_unresolved_item_per_task",
                            )
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(create_table_if_missing, migrations.RunPython.noop),
    ]
