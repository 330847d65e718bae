"""Claims: who may work on a task right now, fenced by a monotonically increasing token.

A claim reads the row (and its checkpoints), applies the transition and
saves it with one conditional update on (state, fencing token). Every later
write by the holder is conditional on the token it got; a worker whose lease
was taken over (a zombie) finds its writes rejected and stops. The lease is
then kept alive by ``tasks.heartbeat`` (``tasks.lifecycle.leases``).
"""

from __future__ import annotations

import functools
import json
import logging
import time

from django.db import connection, transaction
from django.db.models.functions import Now

from tasks import limits
from tasks.claim import Claim, lease_seconds
from tasks.exceptions import LeaseLost
from tasks.lifecycle.fenced_writes import one_statement, task_save_fenced
from tasks.lifecycle.holds import TASK_HOLD_FIELDS, task_hold
from tasks.limits_policy import OPEN_GATE, ControlValues, Gate
from tasks.models import Checkpoint, PipelineControl, Task, TaskHold, TaskState
from tasks.models.door import door

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
                return None
            time.sleep(early.seconds)
    return None


class _TooEarly(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


# The longest a worker waits for a retry that was delivered before its time.
MAX_EARLY_WAIT_SECONDS = 5.0


# A claim writes what a hold does: the state, the hold and its time (cleared), the lease and the attempt count.
CLAIM_FIELDS = TASK_HOLD_FIELDS


def _claim_once(*, task_id: str, owner: str) -> Claim | None:
    # Two round trips: read the row (with the database's clock and, on
    # PostgreSQL, the checkpoints), then one conditional update on the state
    # and token that were read. A concurrent claim or a takeover in between
    # makes the update match nothing, and this delivery ends without effects.
    # Checkpoints read with the row are complete: only the lease holder
    # writes them, and no one can hold the lease until this update wins.
    task = _task_for_claim(task_id)
    if task is None:
        return None
    deadline_passed = task.deadline is not None and task.deadline <= task.db_now
    # A retry waits for its time; so does a later start (run_after), which has no job until the sweeper
    # releases it: a delivery before its time (a duplicate, a job an operator re-queued) leaves it alone.
    waits_for_its_time = task.state == TaskState.RETRY_SCHEDULED or (
        task.state == TaskState.QUEUED and task.hold == TaskHold.START_TIME
    )
    if waits_for_its_time and task.retry_at is not None and task.retry_at > task.db_now:
        if not deadline_passed and not task.is_cancelled:
            raise _TooEarly((task.retry_at - task.db_now).total_seconds())
    if task.state == TaskState.RETRY_SCHEDULED:
        task.make_due()
    gate = OPEN_GATE
    if task.state == TaskState.QUEUED:
        gate = limits.gate_of(pipeline=task.pipeline, control=task.control_read)
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
    task.run_gate = gate
    checkpoints = task.checkpoints_read
    if checkpoints is None:
        checkpoints = Checkpoint.objects.filter(task_id=task.pk).values_list("step_index", "step_name", "output")
    checkpoints = sorted(checkpoints, key=lambda checkpoint: checkpoint[0])
    logger.info(
        "task claimed",
        extra={
            "event": "task_claimed",
            "task_id": str(task.pk),
            "step": task.current_step,
            "attempt": task.step_attempt,
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
        if gate.max_concurrency is not None and not limits.concurrency_slot_take(
            pipeline=task.pipeline, limit=gate.max_concurrency, task_id=task.pk, fencing_token=task.fencing_token + 1
        ):
            hold = TaskHold.CONCURRENCY
        elif gate.rate is not None:
            wait = limits.rate_permit_take(pipeline=task.pipeline, rate=gate.rate)
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
            task.control_read = limits.control_values(task.pipeline)
        return task
    # SQL built once per process instead of a queryset compiled for each delivery.
    columns, converters, sql = _claim_read()
    with connection.cursor() as cursor:
        cursor.execute(sql, [Task._meta.pk.get_db_prep_value(task_id, connection)])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row[: len(columns)])
    for index, column, convert in converters:
        values[index] = convert(values[index], column, connection)
    task = Task.from_db(connection.alias, columns, values)
    task.db_now, triples, control = row[len(columns) :]
    if isinstance(triples, str):
        triples = json.loads(triples)
    if isinstance(control, str):
        control = json.loads(control)
    task.checkpoints_read = [tuple(checkpoint) for checkpoint in triples or ()]
    task.control_read = ControlValues.from_row(control)
    return task


@functools.cache
def _claim_read() -> tuple[list[str], list, str]:
    """Task columns, their from-database converters and the query: the row, the database's clock, the checkpoints.

    And the pipeline's control row (pause and overridden limits, ``tasks.limits``), in the same round trip.
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
    control_columns = ", ".join(f"pc.{q(column)}" for column in limits.CONTROL_COLUMNS)
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
