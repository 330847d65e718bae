"""Old finished tasks with every row a real run leaves, for the retention purge's benchmark: set-based SQL.

Each task ran ``steps`` steps of the ``report`` pipeline long ago: one
attempt, one checkpoint and one ledger row per step. Most succeeded; one in
twenty-five failed and was compensated or closed by an operator, so it also
has a resolved dead letter (resolved when it finished). Their finish times
spread evenly over ``spread_days`` ending ``age_days`` ago, so every one is
past a retention shorter than ``age_days``. Nothing else in the database is
touched: it may hold live tasks.

Task ids are random (as ``uuid4`` ids are), so each statement inserts the
children of its batch in task-id order: the indexes on task id then take
them in one pass instead of one random page per row (three times faster
here). Within a batch (``batch`` tasks, a few days of finishes) a task's
children are therefore not near those of tasks that finished at the same
time, as they would be in a live table: the purge dirties more pages per
batch than it would there, so its measured rate errs low.

PostgreSQL only; ``python manage.py seed_finished_tasks`` is the command line.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from devtools.scale_data.service import SeedRefused
from devtools.scale_data.vacuum import seeded_tables_analyzed

FINISHED_TABLES = ("tasks_task", "tasks_stepattempt", "tasks_checkpoint", "tasks_sideeffect", "dlq_dlqitem")
# Of every 100 tasks: these many compensated and failed-then-closed (each with a resolved dead letter).
COMPENSATED_PER_100 = 2
CLOSED_PER_100 = 2

# One row per (task ordinal i) of the batch; the id is a pure function of the run's salt and i.
TASKS = f"""
    SELECT i, md5(%(salt)s || '/' || i)::uuid AS id,
        CASE WHEN i %% 100 < {COMPENSATED_PER_100} THEN 'compensated'
            WHEN i %% 100 < {COMPENSATED_PER_100 + CLOSED_PER_100} THEN 'failed' ELSE 'succeeded' END AS state,
        %(newest)s - interval '1 second' * (i * %(spread_seconds)s / %(tasks)s) AS finished_at
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""

STATEMENTS = (
    f"""
    INSERT INTO tasks_task (id, pipeline, input, state, current_step, total_steps, step_attempt, total_attempts,
        generation, lease_owner, fencing_token, crash_count, in_dlq, result, failure_reason, failure_code,
        failure_message, failed_step, idempotency_scope, idempotency_key, request_fingerprint, created_at,
        updated_at, finished_at)
    SELECT id, 'report', jsonb_build_object('user_id', 'user-' || i %% 50000, 'topic', 'sales ' || i), state,
        %(steps)s, %(steps)s, 1, %(steps)s, 0, '', 1, 0, false,
        CASE WHEN state = 'succeeded' THEN jsonb_build_object('ok', true, 'steps', %(steps)s) END,
        CASE WHEN state = 'succeeded' THEN '' ELSE 'permanent_error' END,
        CASE WHEN state = 'succeeded' THEN '' ELSE 'refused' END,
        CASE WHEN state = 'succeeded' THEN '' ELSE 'the platform refused the request' END,
        CASE WHEN state = 'succeeded' THEN '' ELSE 'step_' || (%(steps)s - 1) END,
        CASE WHEN i %% 4 = 0 THEN 'python' ELSE '' END,
        CASE WHEN i %% 4 = 0 THEN 'report-' || i END,
        '', finished_at - interval '1 minute', finished_at, finished_at
    FROM ({TASKS}) AS task
    """,
    f"""
    INSERT INTO tasks_stepattempt (task_id, kind, generation, step_index, step_name, attempt, worker, fencing_token,
        started_at, finished_at, outcome, error_code, error_class, error_message, traceback)
    SELECT id, 'step', 0, s, 'step_' || s, 1, 'worker-' || (1 + i %% 8) || ':' || (1000 + i %% 9000), 1,
        finished_at - interval '1 second' * (%(steps)s - s), finished_at - interval '1 second' * (%(steps)s - s - 1),
        'succeeded', '', '', '', ''
    FROM ({TASKS}) AS task, generate_series(0, %(steps)s - 1) AS s
    ORDER BY id, s
    """,
    f"""
    INSERT INTO tasks_checkpoint (task_id, step_index, step_name, output, created_at)
    SELECT id, s, 'step_' || s, jsonb_build_object('step', s, 'ok', true),
        finished_at - interval '1 second' * (%(steps)s - s - 1)
    FROM ({TASKS}) AS task, generate_series(0, %(steps)s - 1) AS s
    ORDER BY id, s
    """,
    f"""
    INSERT INTO tasks_sideeffect (task_id, generation, step_index, step_name, effect_name, effect_key, status,
        created_at, compensated_at)
    SELECT id, 0, s, 'step_' || s, 'call', 'rc-' || id || '-g0-step_' || s || '-call',
        CASE WHEN state = 'compensated' THEN 'compensated' ELSE 'done' END,
        finished_at - interval '1 second' * (%(steps)s - s - 1),
        CASE WHEN state = 'compensated' THEN finished_at END
    FROM ({TASKS}) AS task, generate_series(0, %(steps)s - 1) AS s
    ORDER BY id, s
    """,
    f"""
    INSERT INTO dlq_dlqitem (task_id, pipeline, reason_code, reason, error_code, error_class, error_message,
        failing_step, attempts, input_snapshot, fingerprint, status, compensation_error, resolution_code,
        resolution_note, created_at, updated_at, resolved_at)
    SELECT id, 'report', 'permanent_error', 'the platform refused the request', 'refused',
        'tasks.exceptions.PermanentError', 'the platform refused the request', 'step_' || (%(steps)s - 1), 1,
        '{{}}'::jsonb, 'report:step_' || (%(steps)s - 1) || ':refused', 'resolved', '',
        CASE WHEN state = 'compensated' THEN 'compensated' ELSE 'ignored' END, 'seeded',
        finished_at - interval '30 seconds', finished_at, finished_at
    FROM ({TASKS}) AS task
    WHERE state <> 'succeeded'
    ORDER BY id
    """,
)


def finished_tasks_seed(
    *,
    tasks: int,
    steps: int = 4,
    age_days: float = 60,
    spread_days: float = 30,
    batch: int = 100_000,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, int]:
    """Insert ``tasks`` finished tasks (and their rows) that finished ``age_days`` to ``age_days + spread_days`` ago.

    Returns the rows inserted per table. Raises ``SeedRefused`` when the database is not PostgreSQL.
    """
    if connection.vendor != "postgresql":
        raise SeedRefused(f"seed_finished_tasks needs PostgreSQL; this database is {connection.vendor}")
    if steps < 1 or tasks < 1 or batch < 1:
        raise SeedRefused("tasks, steps and batch must be at least 1")
    started = time.monotonic()
    params = {
        # Its own salt: the ids never collide with rows already there (a live database, an earlier seed).
        "salt": f"finished-{uuid.uuid4().hex}",
        "newest": timezone.now() - timedelta(days=age_days),
        "spread_seconds": spread_days * 86400,
        "tasks": tasks,
        "steps": steps,
    }
    inserted = dict.fromkeys(FINISHED_TABLES, 0)
    with connection.cursor() as cursor:
        # A benchmark load: losing the last commits in a crash costs nothing, waiting for each flush does.
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET jit = off")
        _skip_foreign_key_checks(cursor, progress)
        try:
            for first in range(0, tasks, batch):
                last = min(first + batch, tasks) - 1
                for table, sql in zip(FINISHED_TABLES, STATEMENTS, strict=True):
                    cursor.execute(sql, {**params, "first": first, "last": last})
                    inserted[table] += cursor.rowcount
                elapsed = max(time.monotonic() - started, 1e-6)
                progress(f"finished tasks: {last + 1:,}/{tasks:,} in {elapsed:.0f}s ({(last + 1) / elapsed:,.0f}/s)")
            seeded_tables_analyzed(cursor, FINISHED_TABLES, progress=progress)
        finally:
            cursor.execute("RESET synchronous_commit")
            cursor.execute("RESET jit")
            cursor.execute("RESET session_replication_role")
    progress(f"seeded {tasks:,} finished tasks ({sum(inserted.values()):,} rows) in {time.monotonic() - started:.0f}s")
    return inserted


def _skip_foreign_key_checks(cursor, progress) -> None:
    # The rows are consistent by construction; checking each child's task (a deferred trigger per row) doubles
    # the load time. Only a superuser may switch the triggers off; anyone else gets the checks.
    try:
        with transaction.atomic():
            cursor.execute("SET session_replication_role = replica")
    except DatabaseError:
        progress("not a superuser: every row's foreign keys are checked (slower)")
