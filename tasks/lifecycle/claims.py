"""Claims: who may work on a task right now, fenced by a monotonically increasing token.

A claim reads the row (and its checkpoints), applies the transition and
saves it with one conditional update on (state, fencing token). Every later
write by the holder is conditional on the token it got; a worker whose lease
was taken over (a zombie) finds its writes rejected and stops. The lease is
then kept alive by ``tasks.execution.heartbeat`` (``tasks.lifecycle.leases``).
"""

from __future__ import annotations

import functools
import json
import logging
import time

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from tasks import registry
from tasks.exceptions import LeaseLost
from tasks.execution import gates
from tasks.execution.claim import Claim, lease_seconds
from tasks.lifecycle.fenced_writes import (
    PARAMETER,
    cast_type,
    execute_statement,
    one_statement,
    prepared_form,
    task_save_fenced,
)
from tasks.lifecycle.holds import TASK_HOLD_FIELDS, task_hold
from tasks.models import Checkpoint, PipelineControl, Task, TaskHold, TaskState
from tasks.models.door import door
from tasks.observability.log_fields import task_fields
from tasks.pipelines.limits import OPEN_GATE, ControlValues, Gate

logger = logging.getLogger(__name__)


@door
def task_claim(*, task_id: str, owner: str) -> Claim | None:
    """Claim ``task_id`` for ``owner``; None when there is nothing for this delivery to do.

    Duplicate deliveries and jobs for finished tasks end here without effects:
    only one claim can win the conditional update.
    """
    for _ in range(2):
        try:
            return _claim_once(task_id=task_id, owner=owner)
        except _TooEarly as early:
            # RQ's scheduler works in whole seconds and clocks drift a little:
            # a retry delivered slightly early waits for its time instead of
            # being dropped. A much earlier job is a stray duplicate.
            if early.seconds > MAX_EARLY_WAIT_SECONDS:
                logger.info(
                    "nothing to do", extra={"event": "delivery_skipped", **task_fields(early.task), "worker": owner}
                )
                return None
            time.sleep(early.seconds)
    return None


class _TooEarly(Exception):
    def __init__(self, task: Task, seconds: float) -> None:
        self.task = task
        self.seconds = seconds


# The longest a worker waits for a retry that was delivered before its time.
MAX_EARLY_WAIT_SECONDS = 5.0


# A claim writes what a hold does: the state, the hold and its time (cleared), the lease and the attempt count.
CLAIM_FIELDS = TASK_HOLD_FIELDS


def _claim_once(*, task_id: str, owner: str) -> Claim | None:
    if one_statement():
        task = _claim_plain(task_id=task_id, owner=owner)
        if task is not None:
            return _claimed(task, owner, OPEN_GATE)
    return _claim_read_then_write(task_id=task_id, owner=owner)


def _claim_read_then_write(*, task_id: str, owner: str) -> Claim | None:
    # Two round trips: read the row (with the database's clock and, on
    # PostgreSQL, the checkpoints), then one conditional update on the state
    # and token that were read. A concurrent claim or a takeover in between
    # makes the update match nothing, and this delivery ends without effects.
    # Checkpoints read with the row are complete: only the lease holder
    # writes them, and no one can hold the lease until this update wins.
    task = _task_for_claim(task_id)
    if task is None:
        logger.info("nothing to do", extra={"event": "delivery_skipped", "task_id": str(task_id), "worker": owner})
        return None
    claim = _claim_decided(task, owner)
    if claim is None:
        # A duplicate delivery, a job for a finished or waiting task, a claim another worker won: no effects.
        logger.info("nothing to do", extra={"event": "delivery_skipped", **task_fields(task), "worker": owner})
    return claim


def _claim_decided(task: Task, owner: str) -> Claim | None:
    deadline_passed = task.deadline is not None and task.deadline <= task.db_now
    # A retry waits for its time: one delivered a little early waits for it. A WAITING task (a later start) has no
    # job until the sweeper wakes it: a delivery meanwhile (a duplicate, a job an operator re-queued) finds nothing
    # to claim below and leaves it alone.
    waits_for_its_time = task.state == TaskState.RETRY_SCHEDULED
    if waits_for_its_time and task.retry_at is not None and task.retry_at > task.db_now:
        if not deadline_passed and not task.is_cancelled:
            raise _TooEarly(task, (task.retry_at - task.db_now).total_seconds())
    if task.state == TaskState.RETRY_SCHEDULED:
        task.make_due()
    gate = OPEN_GATE
    if task.state == TaskState.QUEUED:
        gate = gates.gate_of(pipeline=task.pipeline, control=task.control_read)
        # A task past its deadline or cancelled goes through whatever holds its pipeline:
        # the runner fails or cancels it at once, without running a step.
        if gate.paused and not deadline_passed and not task.is_cancelled:
            task_hold(task, TaskHold.PAUSED, gate)
            return None
        if gate.limited and not deadline_passed and not task.is_cancelled:
            if not _claim_within_limits(task, owner, gate):
                return None
        else:
            task.claim(owner=owner, lease_seconds=lease_seconds())
            if not _claim_save(task):
                return None
    elif task.state == TaskState.COMPENSATING and not task.lease_owner:
        task.claim_compensation(owner=owner, lease_seconds=lease_seconds())
        if not _claim_save(task):
            return None
    else:
        return None
    return _claimed(task, owner, gate)


def _claimed(task: Task, owner: str, gate: Gate) -> Claim:
    task.run_gate = gate
    checkpoints = task.checkpoints_read
    if checkpoints is None:
        checkpoints = Checkpoint.objects.filter(task_id=task.pk).values_list("step_index", "step_name", "output")
    checkpoints = sorted(checkpoints, key=lambda checkpoint: checkpoint[0])
    logger.info(
        "task claimed",
        extra={
            "event": "task_claimed",
            **task_fields(task),
            "fencing_token": task.fencing_token,
            "worker": owner,
        },
    )
    return Claim(
        task=task,
        owner=owner,
        outputs={name: output for _, name, output in checkpoints},
        completed=[name for _, name, _ in checkpoints],
        gate=gate,
    )


def _claim_plain(*, task_id: str, owner: str) -> Task | None:
    """The common case in one statement: a task that is queued and nothing else, claimed; None for any other.

    Nothing else means: no hold, no cancel requested, its deadline not
    passed, its pipeline not paused and without limits (declared or set in
    the console). Those are the cases where the two-step path would claim
    without a further read, so the result is the same; everything else
    (a retry, a hold, a paused or limited pipeline, a compensation, a
    duplicate delivery of a running task) matches nothing here and takes
    that path. Two deliveries of one task race on the row: the second
    re-checks the guard after the first committed and matches nothing.
    """
    statement, columns, converters = _plain_claim_statement()
    limited = sorted(
        pipeline.name for pipeline in registry.all_pipelines() if pipeline.max_concurrency or pipeline.rate_limit
    )
    params = [
        TaskState.RUNNING.value,
        owner,
        lease_seconds(),
        timezone.now(),
        Task._meta.pk.get_db_prep_value(task_id, connection),
        TaskState.QUEUED.value,
        TaskHold.NONE.value,
        limited,
    ]
    row = execute_statement(connections[DEFAULT_DB_ALIAS], statement, params)
    if row is None:
        return None
    task, (db_now, triples) = _task_of_row(row, columns, converters)
    task.db_now = db_now
    task.checkpoints_read = _checkpoints_of(triples)
    return task


@functools.cache
def _plain_claim_statement():
    """The one-statement claim (``_claim_plain``): what ``Task.claim`` changes, guarded by what makes it plain."""
    columns, converters, _ = _claim_read()
    q = connection.ops.quote_name
    table, checkpoints = q(Task._meta.db_table), q(Checkpoint._meta.db_table)
    controls = q(PipelineControl._meta.db_table)
    p = PARAMETER

    def column(name: str) -> str:
        return f"{table}.{q(Task._meta.get_field(name).column)}"

    sets = {
        "state": p,
        "lease_owner": p,
        "lease_expires_at": f"STATEMENT_TIMESTAMP() + make_interval(secs => CAST({p} AS double precision))",
        "fencing_token": f"{column('fencing_token')} + 1",
        "step_attempt": f"{column('step_attempt')} + 1",
        "total_attempts": f"{column('total_attempts')} + 1",
        "hold": "''",
        "retry_at": "NULL",
        "updated_at": p,
    }
    # Task.claim's changes, here as SQL (tests/integration/test_plain_claim.py compares the two field by field).
    # A console override that sets no limit and no pause leaves the pipeline plain, as gate_for reads it.
    control_holds = (
        f"SELECT 1 FROM {controls} pc WHERE pc.{q('pipeline')} = {column('pipeline')} AND (pc.{q('paused')} "
        f"OR (pc.{q('concurrency_overridden')} AND COALESCE(pc.{q('max_concurrency')}, 0) > 0) "
        f"OR (pc.{q('rate_overridden')} AND pc.{q('rate_limit')} <> ''))"
    )
    guard = (
        f"{column('state')} = {p} AND {column('hold')} = {p} AND {column('cancel_requested_at')} IS NULL "
        f"AND ({column('deadline')} IS NULL OR {column('deadline')} > STATEMENT_TIMESTAMP()) "
        f"AND {column('pipeline')} <> ALL(CAST({p} AS text[])) AND NOT EXISTS ({control_holds})"
    )
    fields = Task._meta.concrete_fields
    sql = (
        f"UPDATE {table} SET "
        + ", ".join(f"{q(Task._meta.get_field(name).column)} = {value}" for name, value in sets.items())
        # "(guard) IS TRUE": the row is found by its key, not by an index on the state (as in fenced writes).
        + f" WHERE {column('id')} = {p} AND ({guard}) IS TRUE RETURNING "
        + ", ".join(f"{table}.{q(field.column)}" for field in fields)
        + ", STATEMENT_TIMESTAMP(), "
        f"(SELECT jsonb_agg(jsonb_build_array(c.{q('step_index')}, c.{q('step_name')}, c.{q('output')})) "
        f"FROM {checkpoints} c WHERE c.{q('task_id')} = {column('id')})"
    )
    types = ("text", "text", "double precision", "timestamp with time zone", cast_type(Task._meta.pk), "text", "text")
    result_types = (*(field.db_type(connection) for field in fields), "timestamp with time zone", "jsonb")
    return prepared_form(sql, types=(*types, "text[]"), result_types=result_types), columns, converters


def _claim_save(task: Task) -> bool:
    try:
        task_save_fenced(task, CLAIM_FIELDS)
    except LeaseLost:
        return False
    return True


def _claim_within_limits(task: Task, owner: str, gate: Gate) -> bool:
    """Claim ``task`` if a concurrency slot and a rate permit are free (one transaction); else hold it."""
    hold, wait = "", None
    with transaction.atomic():
        if gate.max_concurrency is not None and not gates.concurrency_slot_take(
            pipeline=task.pipeline, limit=gate.max_concurrency, task_id=task.pk, fencing_token=task.fencing_token + 1
        ):
            hold = TaskHold.CONCURRENCY
        elif gate.rate is not None:
            wait = gates.rate_permit_take(pipeline=task.pipeline, rate=gate.rate)
            if wait is not None:
                hold = TaskHold.RATE
        if hold:
            transaction.set_rollback(True)  # the slot taken before a refused permit goes back
        else:
            task.claim(owner=owner, lease_seconds=lease_seconds())
            if not _claim_save(task):
                transaction.set_rollback(True)
                return False
    if hold:
        task_hold(task, hold, gate, wait=wait)
        return False
    return True


def _task_for_claim(task_id: str) -> Task | None:
    """The task with ``db_now`` and ``checkpoints_read`` (on PostgreSQL from the same query, else None).

    ``checkpoints_read`` holds (step index, step name, output) of each checkpoint.
    """
    if not one_statement():
        task = Task.objects.filter(pk=task_id).annotate(db_now=Now()).order_by().first()
        if task is not None:
            task.checkpoints_read = None
            task.control_read = gates.control_values(task.pipeline)
        return task
    # SQL built once per process instead of a queryset compiled for each delivery.
    columns, converters, sql = _claim_read()
    with connection.cursor() as cursor:
        cursor.execute(sql, [Task._meta.pk.get_db_prep_value(task_id, connection)])
        row = cursor.fetchone()
    if row is None:
        return None
    task, (db_now, triples, control) = _task_of_row(row, columns, converters)
    task.db_now = db_now
    if isinstance(control, str):
        control = json.loads(control)
    task.checkpoints_read = _checkpoints_of(triples)
    task.control_read = ControlValues.from_row(control)
    return task


def _task_of_row(row: tuple, columns: list[str], converters: list) -> tuple[Task, tuple]:
    """The task in the first ``len(columns)`` values of ``row`` (as the ORM would load it), and the rest of it."""
    values = list(row[: len(columns)])
    for index, column, convert in converters:
        values[index] = convert(values[index], column, connection)
    return Task.from_db(connection.alias, columns, values), row[len(columns) :]


def _checkpoints_of(triples) -> list[tuple]:
    """(step index, step name, output) of each checkpoint, from the query's ``jsonb_agg`` (text on some drivers)."""
    if isinstance(triples, str):
        triples = json.loads(triples)
    return [tuple(checkpoint) for checkpoint in triples or ()]


@functools.cache
def _claim_read() -> tuple[list[str], list, str]:
    """Task columns, their from-database converters and the query: the row, the database's clock, the checkpoints.

    And the pipeline's control row (pause and overridden limits, ``tasks.execution.gates``), in the same round trip.
    """
    fields = Task._meta.concrete_fields
    converters = []
    for index, task_field in enumerate(fields):
        column = task_field.get_col(Task._meta.db_table)
        for convert in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            converters.append((index, column, convert))
    q = connection.ops.quote_name
    task_table, checkpoints = q(Task._meta.db_table), q(Checkpoint._meta.db_table)
    controls = q(PipelineControl._meta.db_table)
    control_columns = ", ".join(f"pc.{q(column)}" for column in gates.CONTROL_COLUMNS)
    sql = (
        f"SELECT {', '.join(f'{task_table}.{q(task_field.column)}' for task_field in fields)}, STATEMENT_TIMESTAMP(), "
        f"(SELECT jsonb_agg(jsonb_build_array(c.{q('step_index')}, c.{q('step_name')}, c.{q('output')})) "
        f"FROM {checkpoints} c "
        f"WHERE c.{q('task_id')} = {task_table}.{q(Task._meta.pk.column)}), "
        f"(SELECT jsonb_build_array({control_columns}) FROM {controls} pc "
        f"WHERE pc.{q('pipeline')} = {task_table}.{q('pipeline')}) "
        f"FROM {task_table} WHERE {task_table}.{q(Task._meta.pk.column)} = %s"
    )
    return [task_field.attname for task_field in fields], converters, sql
