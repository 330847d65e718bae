"""The one-statement claim (``tasks.lifecycle.claims._claim_plain``): a plain queued task, claimed by one
conditional ``UPDATE … RETURNING``; every other case matches nothing there and takes the two-step path."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools import postgres
from tasks.lifecycle import claims
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.controls import pipeline_limits_set, pipeline_pause, pipeline_resume
from tasks.models import Checkpoint, Task, TaskHold, TaskState
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Columns a claim of one task and a claim of another may rightly differ in.
OWN_COLUMNS = {"id", "input", "request_fingerprint", "created_at", "updated_at", "lease_expires_at", "lease_owner"}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


@pytest.fixture(autouse=True)
def _fresh_statement_state(fresh_statement_state):
    """Each test starts as a process that has met no transaction pooler and made no stored function."""


def _row(task) -> dict:
    return {field.attname: getattr(Task.objects.get(pk=task.pk), field.attname) for field in Task._meta.concrete_fields}


def test_the_plain_claim_writes_what_the_two_step_claim_writes():
    plain_task, stepped_task = (task_submit(pipeline="t_local", input={"n": n}) for n in range(2))

    plain = claims._claim_plain(task_id=str(plain_task.pk), owner="w1")
    stepped = claims._claim_read_then_write(task_id=str(stepped_task.pk), owner="w1")

    assert plain is not None and stepped is not None
    plain_row, stepped_row = _row(plain_task), _row(stepped_task)
    differing = {name for name in plain_row if plain_row[name] != stepped_row[name]}
    assert differing <= OWN_COLUMNS, {name: (plain_row[name], stepped_row[name]) for name in differing - OWN_COLUMNS}
    assert (plain_row["state"], plain_row["fencing_token"], plain_row["step_attempt"]) == ("running", 1, 1)
    for row in (plain_row, stepped_row):
        lease = (row["lease_expires_at"] - row["updated_at"]).total_seconds()
        assert abs(lease - claims.lease_seconds()) < 5, row
    # The instance the runner goes on with is the row as written, guarded by the state and token it now has.
    assert {name: getattr(plain, name) for name in plain_row} == plain_row
    assert plain.fencing_guard() == ("running", 1)


def test_a_plain_claim_is_one_statement_that_brings_the_checkpoints_back():
    task = task_submit(pipeline="t_local", input={})
    first = task_claim(task_id=str(task.pk), owner="w1")
    with door_forced():
        Checkpoint.objects.create(task=task, step_index=0, step_name="local_a", output={"a": [1, None]})
        # An operator's retry puts the task back in the queue with its completed step.
        Task.objects.filter(pk=task.pk).update(state=TaskState.QUEUED, lease_owner="", lease_expires_at=None)

    with CaptureQueriesContext(connection) as queries:
        second = task_claim(task_id=str(task.pk), owner="w2")

    assert len(queries) == 1, [query["sql"] for query in queries]
    assert second is not None and second.outputs == {"local_a": {"a": [1, None]}}
    assert second.completed == ["local_a"]
    assert (second.token, second.task.step_attempt) == (first.token + 1, 2)


def _make(case: str) -> Task:
    """A queued task of ``t_local`` (or of a limited pipeline) in the state ``case`` names."""
    if case == "declared limit":
        return task_submit(pipeline="t_one_at_a_time", input={})
    task = task_submit(pipeline="t_local", input={})
    changes = {
        "hold": {"hold": TaskHold.PAUSED},
        "cancel requested": {"cancel_requested_at": timezone.now(), "cancel_requested_by": "operator"},
        "deadline passed": {"deadline": timezone.now() - timedelta(seconds=1)},
        "retry scheduled": {"state": TaskState.RETRY_SCHEDULED, "retry_at": timezone.now() - timedelta(seconds=1)},
        "running": {"state": TaskState.RUNNING, "lease_owner": "w0", "fencing_token": 1},
        "compensating": {"state": TaskState.COMPENSATING},
    }.get(case)
    if changes:
        with door_forced():
            Task.objects.filter(pk=task.pk).update(**changes)
    elif case == "paused pipeline":
        pipeline_pause(pipeline="t_local", actor="operator", reason="test")
    elif case == "limit set in the console":
        pipeline_limits_set(pipeline="t_local", actor="operator", reason="test", max_concurrency=3)
    return task


NOT_PLAIN = [
    "hold",
    "cancel requested",
    "deadline passed",
    "retry scheduled",
    "running",
    "compensating",
    "paused pipeline",
    "limit set in the console",
    "declared limit",
]


@pytest.mark.parametrize("case", NOT_PLAIN)
def test_every_other_case_matches_nothing_and_changes_nothing(case):
    task = _make(case)
    before = _row(task)

    assert claims._claim_plain(task_id=str(task.pk), owner="w1") is None
    assert _row(task) == before


def test_a_console_row_that_holds_nothing_back_leaves_the_pipeline_plain():
    task = task_submit(pipeline="t_local", input={})
    pipeline_pause(pipeline="t_local", actor="operator", reason="test")
    pipeline_resume(pipeline="t_local", actor="operator", reason="test")

    assert claims._claim_plain(task_id=str(task.pk), owner="w1") is not None


def _session() -> object:
    """A session of its own on the test database (not one of Django's)."""
    return postgres.connect(database_url())


def _waiting_on_the_row_lock(count: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] >= count


def test_two_deliveries_of_one_task_race_and_only_one_claims_it():
    task = task_submit(pipeline="t_local", input={})
    token_before = Task.objects.get(pk=task.pk).fencing_token
    # A third session holds the row, so both deliveries' updates are under way and wait on it together.
    locker = _session()
    with locker.cursor() as cursor:
        cursor.execute("SELECT 1 FROM tasks_task WHERE id = %s FOR UPDATE", [str(task.pk)])
    results: dict[str, object] = {}

    def deliver(owner: str) -> None:
        try:
            results[owner] = task_claim(task_id=str(task.pk), owner=owner)
        finally:
            connections.close_all()

    deliveries = [threading.Thread(target=deliver, args=(owner,)) for owner in ("w1", "w2")]
    for delivery in deliveries:
        delivery.start()
    try:
        wait_for(lambda: _waiting_on_the_row_lock(2), timeout=30, message="both claims to wait on the row")
    finally:
        locker.commit()
        locker.close()
    for delivery in deliveries:
        delivery.join(timeout=30)

    winners = [owner for owner, claim in results.items() if claim is not None]
    assert len(results) == 2 and len(winners) == 1, results
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.lease_owner, row.fencing_token) == ("running", winners[0], token_before + 1)
    assert Task.objects.filter(pk=task.pk, state=TaskState.RUNNING).count() == 1
