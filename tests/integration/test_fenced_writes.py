"""A step's outcome as one fenced statement, the claim's one round trip, and the shared heartbeat thread."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import LeaseLost
from tasks.execution.attempts import AttemptRecord
from tasks.execution.heartbeat import Heartbeat
from tasks.lifecycle import fenced_writes
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.outcomes import step_succeeded
from tasks.models import (
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    EffectStatus,
    SideEffect,
    StepAttempt,
    Task,
    TaskState,
)
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import index_scans, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


@pytest.fixture(autouse=True)
def _fresh_statement_state(fresh_statement_state):
    """Each test starts as a process that has met no transaction pooler and made no stored function."""


@pytest.fixture(params=["postgresql", "portable"])
def write_path(request, monkeypatch):
    """Each test runs on PostgreSQL's one-statement path and on the ORM path other databases take."""
    if request.param == "portable":
        monkeypatch.setattr(fenced_writes, "ONE_STATEMENT_VENDORS", frozenset())
    return request.param


def record(index: int, name: str, worker: str = "w1") -> AttemptRecord:
    now = timezone.now()
    return AttemptRecord(
        kind=AttemptKind.STEP,
        step_index=index,
        step_name=name,
        attempt=1,
        worker=worker,
        started_at=now,
        finished_at=now,
        outcome=AttemptOutcome.SUCCEEDED,
    )


def test_a_step_writes_progress_checkpoint_attempt_and_ledger_together(write_path):
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    claimed = Task.objects.get(pk=task.pk)

    step_succeeded(claim=claim, record=record(0, "local_a"), output={"a": "k"}, used_keys={"a": "key-a"}, is_last=False)

    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.current_step, row.step_attempt, row.total_attempts) == ("running", 1, 1, 2)
    # Progress touches no indexed column (the heartbeat keeps the lease): see the HOT test below.
    assert (row.lease_expires_at, row.updated_at) == (claimed.lease_expires_at, claimed.updated_at)
    if write_path == "postgresql":
        # The instance holds what was written, the lease's database-computed expiry included.
        assert claim.task.lease_expires_at == row.lease_expires_at
    assert Checkpoint.objects.get(task=task, step_index=0).output == {"a": "k"}
    attempt = StepAttempt.objects.get(task=task, step_index=0)
    assert (attempt.outcome, attempt.fencing_token, attempt.worker) == ("succeeded", claim.token, "w1")
    assert SideEffect.objects.get(task=task).effect_key == "key-a"

    step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=True)
    row.refresh_from_db()
    assert (row.state, row.result, row.lease_owner, row.lease_expires_at) == ("succeeded", {"b": 2}, "", None)
    assert row.finished_at is not None
    assert Checkpoint.objects.filter(task=task).count() == 2


def test_a_zombie_step_writes_nothing(write_path):
    task = task_submit(pipeline="t_local", input={})
    zombie = task_claim(task_id=str(task.pk), owner="zombie")
    with door_forced():
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once().requeued == 1
    successor = task_claim(task_id=str(task.pk), owner="successor")
    attempts_before = StepAttempt.objects.filter(task=task).count()

    with pytest.raises(LeaseLost):
        step_succeeded(
            claim=zombie, record=record(0, "local_a", "zombie"), output={}, used_keys={"a": "key-a"}, is_last=False
        )

    assert not Checkpoint.objects.filter(task=task).exists()
    assert not SideEffect.objects.filter(task=task).exists()
    assert StepAttempt.objects.filter(task=task).count() == attempts_before
    row = Task.objects.get(pk=task.pk)
    assert (row.lease_owner, row.fencing_token, row.current_step) == ("successor", successor.token, 0)


def test_a_row_of_another_task_is_refused_and_nothing_is_written():
    """A fenced write's rows take the written task's id from the statement itself: a row naming another task is a
    programming error, refused before anything is sent."""
    task = task_submit(pipeline="t_local", input={})
    other = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    stray = fenced_writes.NewRow(
        Checkpoint, {"task_id": other.pk, "step_index": 0, "step_name": "local_a", "output": {}}
    )
    with pytest.raises(ValueError, match="row of another task"), door_forced():
        fenced_writes.task_save_fenced(claim.task, ["current_step"], rows=[stray])
    assert not Checkpoint.objects.exists()
    assert Task.objects.get(pk=task.pk).fencing_token == claim.token


def test_a_write_after_another_writer_changed_the_state_is_rejected(write_path):
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    # Same token, other state: the state guard alone must reject the write.
    with door_forced():
        Task.objects.filter(pk=task.pk).update(state="compensating")

    with pytest.raises(LeaseLost):
        step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
    assert not Checkpoint.objects.filter(task=task).exists()


def test_a_ledger_key_already_recorded_is_kept_and_the_step_still_commits(write_path):
    first = task_submit(pipeline="t_local", input={"n": 1})
    SideEffect.objects.create(
        task=first, step_index=0, step_name="local_a", effect_name="a", effect_key="shared", status="uncertain"
    )
    task = task_submit(pipeline="t_local", input={"n": 2})
    claim = task_claim(task_id=str(task.pk), owner="w1")

    step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={"a": "shared"}, is_last=False)

    assert Checkpoint.objects.filter(task=task).count() == 1
    assert SideEffect.objects.get(effect_key="shared").task_id == first.pk
    assert SideEffect.objects.get(effect_key="shared").status == EffectStatus.UNCERTAIN


def test_a_claim_after_a_crash_reads_the_checkpoints_back(write_path):
    task = task_submit(pipeline="t_local", input={})
    first = task_claim(task_id=str(task.pk), owner="w1")
    step_succeeded(claim=first, record=record(0, "local_a"), output={"a": [1, None]}, used_keys={}, is_last=False)
    with door_forced():
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once().requeued == 1

    second = task_claim(task_id=str(task.pk), owner="w2")

    assert second is not None and second.token > first.token
    assert second.outputs == {"local_a": {"a": [1, None]}}
    assert second.completed == ["local_a"]
    assert (second.task.current_step, second.task.lease_owner) == (1, "w2")
    assert task_claim(task_id=str(task.pk), owner="w3") is None


def test_a_step_costs_one_statement_and_a_claim_one():
    tasks = [task_submit(pipeline="t_local", input={"n": n}) for n in range(2)]
    claim = task_claim(task_id=str(tasks[0].pk), owner="w1")
    step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)

    with CaptureQueriesContext(connection) as claim_queries:
        other = task_claim(task_id=str(tasks[1].pk), owner="w1")
    with CaptureQueriesContext(connection) as step_queries:
        step_succeeded(claim=other, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)

    # A plain queued task: one conditional update that returns the row and its checkpoints
    # (tests/integration/test_plain_claim.py).
    assert [query["sql"].split()[0] for query in claim_queries] == ["EXECUTE"], claim_queries
    # The statement was prepared on this connection by the first step: one round trip, no BEGIN/COMMIT.
    assert [query["sql"].split()[0] for query in step_queries] == ["EXECUTE"]


def test_the_fenced_update_finds_the_task_by_its_primary_key():
    # Statistics taken while many tasks wait and none runs make "state =
    # 'running'" look selective: a plain condition on state would then be
    # answered from the state index, walking every running task on each step.
    with door_forced():
        Task.objects.bulk_create(Task(pipeline="t_local", total_steps=2) for _ in range(500))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")
    claims = [task_claim(task_id=str(task_submit(pipeline="t_local", input={"n": n}).pk), owner="w") for n in range(30)]
    step_succeeded(claim=claims[0], record=record(0, "local_a"), output={}, used_keys={}, is_last=False)

    with CaptureQueriesContext(connection) as queries:
        step_succeeded(claim=claims[1], record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries[0]["sql"])
        plan = "\n".join(line for (line,) in cursor.fetchall())

    # Found through the primary key, whether the planner reads it as an Index Scan or a Bitmap Index
    # Scan (which one depends on the statistics earlier tests left); never through another index.
    task_scans = [name for _, name in index_scans(plan)]
    assert "tasks_task_pkey" in task_scans, plan
    task_indexes = {index.name for index in Task._meta.indexes} | {"tasks_task_pkey"}
    assert [index for index in task_scans if index in task_indexes] == ["tasks_task_pkey"], plan
    assert "Seq Scan on tasks_task" not in plan, plan


def test_a_session_that_lost_its_statements_turns_the_process_to_plain_statements(caplog):
    # What a transaction pooler does to a prepared statement: the next
    # transaction runs on a server session that does not have it.
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")

    with CaptureQueriesContext(connection) as queries:  # the same statement as the first step's
        step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=False)

    assert Checkpoint.objects.filter(task=task).count() == 2
    assert [query["sql"].split()[0] for query in queries] == ["EXECUTE", "WITH"]
    assert [record.event for record in caplog.records if hasattr(record, "event")].count("pooler_detected") == 1
    assert not fenced_writes.prepared_statements()


def test_a_name_another_session_already_prepared_is_not_an_error():
    # Through a pooler, PREPARE may land on a server session where another
    # client prepared the same statement ("already exists").
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
    fenced_writes._prepared.clear()  # this connection forgets; the server session still has the names

    step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=False)

    assert Checkpoint.objects.filter(task=task).count() == 2
    assert not fenced_writes.prepared_statements()


@pytest.mark.parametrize(("pooler", "functions"), [("transaction", True), ("transaction", False), ("none", True)])
def test_behind_a_transaction_pooler_nothing_is_prepared(settings, pooler, functions):
    settings.DATABASE_POOLER = pooler
    settings.RELIABILITY_DATABASE_STORED_FUNCTIONS = functions
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")

    with CaptureQueriesContext(connection) as queries:
        step_succeeded(claim=claim, record=record(0, "local_a"), output={"a": 1}, used_keys={}, is_last=False)
        step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": "100%"}, used_keys={}, is_last=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        prepared = cursor.fetchone()[0]

    verbs = [query["sql"].split()[0] for query in queries]
    if pooler == "transaction" and functions:
        # Each shape's function made once (by the first process that needs it), then called.
        assert verbs == ["CREATE", "SELECT", "CREATE", "SELECT"] and prepared == 0
        assert all(query["sql"].startswith("SELECT * FROM rc_fn_") for query in queries[1::2])
    elif pooler == "transaction":
        assert verbs == ["WITH", "WITH"] and prepared == 0
    else:
        # (statements an earlier test prepared on this connection are not prepared again)
        assert [verb for verb in verbs if verb != "PREPARE"] == ["EXECUTE", "EXECUTE"] and prepared >= 2
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    assert dict(Checkpoint.objects.filter(task=task).values_list("step_index", "output")) == {
        0: {"a": 1},
        1: {"b": "100%"},
    }


@pytest.fixture
def server_side_binding():
    """The default connection as a project on psycopg 3 may configure it: parameters bound on the server."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    connection.close()
    options["server_side_binding"] = True
    yield
    connection.close()
    del options["server_side_binding"]


@pytest.mark.skipif(not is_psycopg3, reason="server-side binding is psycopg 3's option")
def test_with_server_side_binding_a_step_goes_through_its_stored_function(server_side_binding):
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    with connection.cursor() as cursor:
        assert type(cursor.cursor).__name__ == "ServerBindingCursor"

    with CaptureQueriesContext(connection) as queries:
        step_succeeded(claim=claim, record=record(0, "local_a"), output={"a": "50%"}, used_keys={}, is_last=False)
        step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=True)

    # EXECUTE takes no bound parameters ("there is no parameter $1"): the stored function takes them.
    assert [query["sql"].split()[0] for query in queries] == ["CREATE", "SELECT", "CREATE", "SELECT"]
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    outputs = dict(Checkpoint.objects.filter(task=task).values_list("step_index", "output"))
    assert outputs == {0: {"a": "50%"}, 1: {"b": 2}}


def test_the_heartbeat_extends_the_lease_until_its_task_ends():
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")

    def expiry():
        return Task.objects.get(pk=task.pk).lease_expires_at

    first = expiry()
    with Heartbeat(task_id=task.pk, fencing_token=claim.token, interval=0.05):
        second = wait_for(lambda: (value := expiry()) > first and value, timeout=10)
        wait_for(lambda: expiry() > second, timeout=10)
    ended = expiry()
    time.sleep(0.3)  # six intervals: long enough for a beat that should not happen
    assert expiry() == ended


def test_the_heartbeat_reports_a_lease_taken_over():
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    with door_forced():
        Task.objects.filter(pk=task.pk).update(fencing_token=claim.token + 1)

    with Heartbeat(task_id=task.pk, fencing_token=claim.token, interval=0.05) as heartbeat:
        assert heartbeat.lost.wait(timeout=10)


def test_heartbeats_of_two_tasks_share_one_thread_and_give_its_connection_back():
    claims = [task_claim(task_id=str(task_submit(pipeline="t_local", input={"n": n}).pk), owner="w") for n in range(2)]

    def expiry(claim):
        return Task.objects.get(pk=claim.task.pk).lease_expires_at

    before = [expiry(claim) for claim in claims]
    with Heartbeat(task_id=claims[0].task.pk, fencing_token=claims[0].token, interval=0.05):
        with Heartbeat(task_id=claims[1].task.pk, fencing_token=claims[1].token, interval=0.05):
            wait_for(lambda: all(expiry(claim) > old for claim, old in zip(claims, before, strict=True)), timeout=10)
            assert [thread.name for thread in threading.enumerate()].count("heartbeat") == 1

    def other_sessions():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    wait_for(lambda: other_sessions() == 0, timeout=10, message="the heartbeat thread kept its connection")


@pytest.mark.parametrize("model", [Task, Checkpoint, StepAttempt, SideEffect])
def test_values_skip_only_conversions_that_would_change_nothing(model):
    samples = [None, 0, 7, True, 2.5, "", "7", "x" * 3, uuid.uuid4(), timezone.now(), {"a": [1, None]}, [1, "b"]]
    samples += [TaskState.RUNNING, AttemptOutcome.SUCCEEDED]  # text choices: sent as the plain strings they are

    def literal(convert, value):
        try:
            with connection.cursor() as cursor:
                return cursor.mogrify("%s", [convert(value, connection)])
        except Exception as exc:  # the same refusal either way
            return type(exc)

    for field in model._meta.concrete_fields:
        shortcut = fenced_writes._to_db(field)
        for value in samples:
            assert literal(shortcut, value) == literal(field.get_db_prep_save, value), (field, value)


def test_a_steps_progress_is_a_heap_only_update_of_the_task_row():
    """No index entry is written for the task per step: PostgreSQL counts the update as HOT."""
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")

    def updates() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'tasks_task'")
            return cursor.fetchone()

    # Inside one transaction, so this transaction's own counters show the statement's kind of update.
    with transaction.atomic():
        before = updates()
        step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
        after = updates()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def _pooled(settings) -> None:
    settings.DATABASE_POOLER = "transaction"
    settings.RELIABILITY_DATABASE_STORED_FUNCTIONS = True


def test_a_stored_function_dropped_meanwhile_is_made_again(settings):
    _pooled(settings)
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid::regprocedure FROM pg_proc WHERE proname LIKE 'rc_fn_%'")
        for (function,) in cursor.fetchall():
            cursor.execute(f"DROP FUNCTION {function}")

    step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=True)

    assert Task.objects.get(pk=task.pk).state == "succeeded"


@pytest.fixture
def user_without_create():
    """The test connection as a database user who may write the tables but not create functions."""
    with connection.cursor() as cursor:
        cursor.execute("DROP ROLE IF EXISTS rc_no_create")
        cursor.execute("CREATE ROLE rc_no_create")
        cursor.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO rc_no_create")
        cursor.execute("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO rc_no_create")
        cursor.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        cursor.execute("SET ROLE rc_no_create")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")
        cursor.execute("DROP OWNED BY rc_no_create")
        cursor.execute("DROP ROLE rc_no_create")


def test_a_user_who_may_not_create_functions_gets_plain_statements(settings, user_without_create, caplog):
    _pooled(settings)
    task = task_submit(pipeline="t_local", input={})
    claim = task_claim(task_id=str(task.pk), owner="w1")

    with CaptureQueriesContext(connection) as queries:
        step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
        step_succeeded(claim=claim, record=record(1, "local_b"), output={"b": 2}, used_keys={}, is_last=True)

    assert [query["sql"].split()[0] for query in queries] == ["WITH", "WITH"]  # the refused CREATE is not logged
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    events = [entry.event for entry in caplog.records if hasattr(entry, "event")]
    assert events.count("stored_functions_refused") == 1


def test_processes_that_make_one_function_at_once_all_go_on(settings):
    _pooled(settings)
    tasks = [task_submit(pipeline="t_local", input={"n": n}) for n in range(6)]
    claims = [task_claim(task_id=str(task.pk), owner=f"w{n}") for n, task in enumerate(tasks)]
    errors = []
    start = threading.Barrier(len(claims))

    def first_step(claim) -> None:
        try:
            start.wait(timeout=10)
            step_succeeded(claim=claim, record=record(0, "local_a"), output={}, used_keys={}, is_last=False)
        except Exception as exc:  # the test reports whatever a thread met
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first_step, args=(claim,)) for claim in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert Checkpoint.objects.filter(task__in=tasks).count() == len(tasks)
