"""``DLQItem`` becomes the console's proxy of the engine's ``tasks.DeadLetter`` (same table, same rows).

State only: nothing in the database changes. The proxy keeps the content
type ``dlq.dlqitem``, so its permissions (view, retry, close, bulk…) and the
groups that hold them stay as they were, and so do the admin's URLs.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0007_dlq_covering_indexes"),
        ("tasks", "0008_dead_letters_owned_by_the_engine"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="DLQItem"),
                migrations.CreateModel(
                    name="DLQItem",
                    fields=[],
                    options={
                        "verbose_name": "dead-letter item",
                        "verbose_name_plural": "dead-letter queue",
                        "ordering": ["-created_at"],
                        "permissions": [
                            ("retry_dlqitem", "Can retry a dead letter from its checkpoint"),
                            ("retry_from_start_dlqitem", "Can retry a compensated dead letter from the start"),
                            ("compensate_dlqitem", "Can compensate a dead letter"),
                            ("close_dlqitem", "Can close (resolve) a dead letter"),
                            ("bulk_dlqitem", "Can act on dead letters in bulk"),
                            ("approve_bulk_dlqitem", "Can approve another operator's bulk action"),
                        ],
                        "proxy": True,
                        "indexes": [],
                        "constraints": [],
                    },
                    bases=("tasks.deadletter",),
                ),
            ],
        ),
    ]
