"""The lease extension: the holder pushes its lease forward, fenced on the token it claimed with."""

from __future__ import annotations

from django.db import connection

from tasks.exceptions import LeaseLost
from tasks.execution.claim import lease_seconds
from tasks.lifecycle.fenced_writes import one_statement
from tasks.models import LEASED_STATES, Task, lease_expiry
from tasks.models.door import door


@door
def lease_extend(*, task_id, fencing_token: int) -> bool:
    """Push the lease forward, or raise ``LeaseLost`` when the token no longer holds it.

    Returns whether a cancel of the task was requested (the heartbeat stops a waiting step on it).
    """
    leased = Task.objects.filter(pk=task_id, fencing_token=fencing_token, state__in=LEASED_STATES)
    if one_statement():
        q = connection.ops.quote_name
        table = q(Task._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {q('lease_expires_at')} = STATEMENT_TIMESTAMP() + make_interval(secs => %s) "
                f"WHERE {q('id')} = %s AND {q('fencing_token')} = %s AND {q('state')} = ANY(%s) "
                f"RETURNING {q('cancel_requested_at')} IS NOT NULL",
                # An array with either driver (psycopg2 expands a tuple for "IN %s", psycopg 3 does not).
                [lease_seconds(), task_id, fencing_token, list(LEASED_STATES)],
            )
            row = cursor.fetchone()
        if row is None:
            raise LeaseLost(f"task {task_id}: lease with token {fencing_token} was taken over")
        return bool(row[0])
    extended = leased.update(lease_expires_at=lease_expiry(lease_seconds()))
    if not extended:
        raise LeaseLost(f"task {task_id}: lease with token {fencing_token} was taken over")
    return Task.objects.filter(pk=task_id, cancel_requested_at__isnull=False).exists()
