"""Checkpoints keyed by step name; tasks record their pipeline's step names (issue #13, point 4).

Existing rows are converted:

- ``Task.step_names`` of tasks that may run again (any state but
  ``succeeded``; a succeeded task never runs a step again, and most rows of
  a large table are succeeded ones, left as they are: an empty list reads
  "as declared now"): the pipeline's current declaration when the pipeline
  is registered in the process that migrates (the same code the workers run
  after the deploy, one UPDATE per pipeline); otherwise the names the task's
  own checkpoints and step attempts carry, ordered by step index. A task
  that ran under an older declaration is then checked at its next claim
  against its checkpoints, which say what really ran (tasks.pipelines.changes).
- ``Checkpoint.has_compensation`` stays NULL ("unknown") on existing rows:
  compensation then skips a step that declares no compensation, as before,
  and fails with a reason only when the step is gone altogether.
- The unique key moves from (task, step index) to (task, step name). A task
  whose pipeline already changed under it may hold two checkpoints of one
  name (the step ran at two positions): the first one it wrote is kept. On
  PostgreSQL its index is built CONCURRENTLY (no write lock on a large live
  table: one checkpoint per step of every task) and then becomes the
  constraint, hence ``atomic = False`` as in 0013.
"""

from django.db import migrations, models
from django.db.models import Min

# Tasks whose names are collected from their own rows per batch (unregistered pipelines only).
BATCH_SIZE = 1000


def checkpoints_deduplicated(apps, schema_editor):
    Checkpoint = apps.get_model("tasks", "Checkpoint")
    duplicated = (
        Checkpoint.objects.values("task_id", "step_name")
        .annotate(first=Min("id"), n=models.Count("id"))
        .filter(n__gt=1)
        .values_list("task_id", "step_name", "first")
    )
    for task_id, step_name, first in list(duplicated):
        Checkpoint.objects.filter(task_id=task_id, step_name=step_name).exclude(pk=first).delete()


def step_names_recorded(apps, schema_editor):
    from tasks import registry
    from tasks.exceptions import UnknownPipeline

    Task = apps.get_model("tasks", "Task")
    Checkpoint = apps.get_model("tasks", "Checkpoint")
    StepAttempt = apps.get_model("tasks", "StepAttempt")
    may_run_again = Task.objects.exclude(state="succeeded")
    unknown = []
    for name in may_run_again.order_by().values_list("pipeline", flat=True).distinct():
        try:
            steps = [step.name for step in registry.get(name).steps]
        except UnknownPipeline:
            unknown.append(name)
            continue
        may_run_again.filter(pipeline=name).update(step_names=steps)
    tasks = may_run_again.filter(pipeline__in=unknown).order_by("pk").values_list("pk", flat=True)
    last = None
    while True:
        batch = list((tasks.filter(pk__gt=last) if last else tasks)[:BATCH_SIZE])
        if not batch:
            break
        last = batch[-1]
        names: dict = {pk: {} for pk in batch}
        for task_id, index, step_name in StepAttempt.objects.filter(
            task_id__in=batch, kind="step", step_index__gte=0
        ).values_list("task_id", "step_index", "step_name"):
            names[task_id][index] = step_name
        # A checkpoint says what completed at that index: it wins over an attempt's name.
        for task_id, index, step_name in Checkpoint.objects.filter(task_id__in=batch).values_list(
            "task_id", "step_index", "step_name"
        ):
            names[task_id][index] = step_name
        for pk, by_index in names.items():
            if by_index:
                Task.objects.filter(pk=pk).update(step_names=[by_index[i] for i in sorted(by_index)])


UNIQUE_NAME = "checkpoint_unique_step_name"


def unique_by_name(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.execute(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {UNIQUE_NAME} ON tasks_checkpoint (task_id, step_name)", params=None
        )
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [UNIQUE_NAME])
        row = cursor.fetchone()
    if row and row[0]:  # a concurrent build that failed leaves an INVALID index behind
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {UNIQUE_NAME}", params=None)
    schema_editor.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {UNIQUE_NAME} ON tasks_checkpoint (task_id, step_name)",
        params=None,
    )
    schema_editor.execute(
        f"ALTER TABLE tasks_checkpoint ADD CONSTRAINT {UNIQUE_NAME} UNIQUE USING INDEX {UNIQUE_NAME}", params=None
    )


def unique_by_name_dropped(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE tasks_checkpoint DROP CONSTRAINT IF EXISTS {UNIQUE_NAME}", params=None)
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {UNIQUE_NAME}", params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0013_activity_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="has_compensation",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="step_names",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AlterField(
            model_name="task",
            name="failure_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("permanent_error", "permanent error"),
                    ("attempts_exhausted", "attempts exhausted"),
                    ("deadline_exceeded", "deadline exceeded"),
                    ("crash_loop", "crash loop"),
                    ("compensation_failed", "compensation failed"),
                    ("pipeline_changed", "pipeline changed"),
                ],
                default="",
                max_length=40,
            ),
        ),
        migrations.RemoveConstraint(
            model_name="checkpoint",
            name="checkpoint_unique_step",
        ),
        migrations.RunPython(checkpoints_deduplicated, migrations.RunPython.noop, elidable=True),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="checkpoint",
                    constraint=models.UniqueConstraint(fields=("task", "step_name"), name=UNIQUE_NAME),
                ),
            ],
            database_operations=[migrations.RunPython(unique_by_name, unique_by_name_dropped)],
        ),
        migrations.RunPython(step_names_recorded, migrations.RunPython.noop, elidable=True),
    ]
