"""Batch submission (``tasks.submission.batches.task_submit_many``): items that are submissions of their own, in one
transaction, delivered several per RQ job."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from redis import Redis
from rq.serializers import JSONSerializer

from tasks import task_submit
from tasks.delivery.enqueue import delivery_job_id, get_queue, job_id
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import BatchRefused, InvalidTaskInput
from tasks.models import IdempotencyRecord, IdempotencyState, Task
from tasks.models.door import door_forced
from tasks.registry import RUN_TASKS_ENTRY_POINT
from tasks.submission.batches import MAX_BATCH_ITEMS, BatchItem, task_submit_many

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def _jobs() -> list:
    queue = get_queue()
    return [queue.fetch_job(job_id) for job_id in queue.job_ids]


def test_items_become_tasks_in_order_and_share_jobs_by_the_delivery_size():
    items = [{"pipeline": "t_quiet_1", "input": {"n": n}} for n in range(45)]
    with override_settings(RELIABILITY_BATCH_DELIVERY_SIZE=20):
        outcomes = task_submit_many(items)

    assert [outcome.index for outcome in outcomes] == list(range(45))
    assert all(outcome.created is not None and outcome.error is None for outcome in outcomes)
    tasks = {task.pk: task for task in Task.objects.filter(pk__in=[o.task_id for o in outcomes])}
    assert [tasks[o.task_id].input for o in outcomes] == [{"n": n} for n in range(45)]
    jobs = _jobs()
    # 20 + 20 + 5, each a job of the batch entry point naming its tasks in submission order.
    assert [len(job.args[0]) for job in jobs] == [20, 20, 5]
    assert {job.func_name for job in jobs} == {RUN_TASKS_ENTRY_POINT}
    assert [task_id for job in jobs for task_id in job.args[0]] == [str(o.task_id) for o in outcomes]
    for job in jobs:
        assert {tasks[o.task_id].batch_job for o in outcomes if str(o.task_id) in job.args[0]} == {job.id}


def test_a_batch_is_a_handful_of_statements_whatever_its_size():
    def statements(count: int) -> int:
        items = [
            {"pipeline": "t_quiet_1", "input": {"n": n}, "idempotency_key": f"k-{count}-{n}"} for n in range(count)
        ]
        with CaptureQueriesContext(connection) as queries:
            task_submit_many(items)
        return len(queries)

    assert statements(10) == statements(200)


def test_a_bad_item_refuses_only_itself():
    outcomes = task_submit_many(
        [
            {"pipeline": "t_quiet_1", "input": {"n": 1}},
            {"pipeline": "no_such_pipeline", "input": {}},
            {"pipeline": "t_quiet_1", "input": {"n": 3}, "deadline": -5},
            {"pipeline": "t_quiet_1", "input": {"n": 4}, "colour": "red"},
            {"pipeline": "t_quiet_1", "input": {"n": 5}},
        ]
    )
    assert [outcome.error.code if outcome.error else "created" for outcome in outcomes] == [
        "created",
        "unknown_pipeline",
        "validation_error",
        "validation_error",
        "created",
    ]
    assert Task.objects.count() == 2


def test_an_atomic_batch_with_a_bad_item_stores_nothing():
    with pytest.raises(BatchRefused) as refused:
        task_submit_many(
            [
                {"pipeline": "t_quiet_1", "input": {"n": 1}, "idempotency_key": "a-1"},
                {"pipeline": "no_such_pipeline", "input": {}, "idempotency_key": "a-2"},
            ],
            atomic=True,
        )
    assert refused.value.details == {
        "items": [
            {"index": 1, "code": "unknown_pipeline", "message": "no pipeline named 'no_such_pipeline' is registered"}
        ]
    }
    assert not Task.objects.exists()
    assert not IdempotencyRecord.objects.exists()
    assert get_queue().count == 0


def test_keys_replay_across_batches_and_single_submissions():
    single = task_submit(pipeline="t_quiet_1", input={"n": 0}, idempotency_key="shared-0")
    first = task_submit_many(
        [
            {"pipeline": "t_quiet_1", "input": {"n": 0}, "idempotency_key": "shared-0"},
            {"pipeline": "t_quiet_1", "input": {"n": 1}, "idempotency_key": "shared-1"},
            # The same key twice in one batch: the second is a repeat of the first.
            {"pipeline": "t_quiet_1", "input": {"n": 1}, "idempotency_key": "shared-1"},
            # The same key with another request: refused, as a single submission would be.
            {"pipeline": "t_quiet_1", "input": {"n": 99}, "idempotency_key": "shared-1"},
            {"pipeline": "t_quiet_1", "input": {"n": 42}, "idempotency_key": "shared-0"},
        ]
    )
    assert (first[0].replayed, first[0].task_id) == (True, single.pk)
    assert first[1].created is not None
    assert (first[2].replayed, first[2].task_id) == (True, first[1].task_id)
    assert first[3].error.code == "idempotency_key_reused"
    assert first[4].error.code == "idempotency_key_reused"

    again = task_submit_many([{"pipeline": "t_quiet_1", "input": {"n": 1}, "idempotency_key": "shared-1"}])
    assert (again[0].replayed, again[0].task_id) == (True, first[1].task_id)
    assert task_submit(pipeline="t_quiet_1", input={"n": 1}, idempotency_key="shared-1").pk == first[1].task_id
    record = IdempotencyRecord.objects.get(key="shared-1")
    # Replayed by the later batch and by the single submission (a repeat inside its own batch is no replay).
    assert (record.state, record.task_id, record.replay_count) == (IdempotencyState.COMPLETED, first[1].task_id, 2)
    assert Task.objects.count() == 2


def test_a_key_in_flight_elsewhere_refuses_its_item_and_a_stale_one_is_taken_over():
    now = timezone.now()
    IdempotencyRecord.objects.create(
        scope="python", key="busy", fingerprint="x", locked_at=now, expires_at=now + timedelta(hours=1)
    )
    outcomes = task_submit_many([{"pipeline": "t_quiet_1", "input": {}, "idempotency_key": "busy"}])
    assert outcomes[0].error.code == "idempotency_key_reused"  # another request under it

    item = BatchItem(pipeline="t_quiet_1", input={"n": 7}, idempotency_key="stale")
    from tasks.submission.submit import request_fingerprint

    fingerprint = request_fingerprint(pipeline="t_quiet_1", input={"n": 7}, deadline_seconds=None)
    IdempotencyRecord.objects.create(
        scope="python",
        key="stale",
        fingerprint=fingerprint,
        locked_at=now - timedelta(hours=1),
        expires_at=now + timedelta(hours=1),
    )
    IdempotencyRecord.objects.create(
        scope="python", key="fresh", fingerprint=fingerprint, locked_at=now, expires_at=now + timedelta(hours=1)
    )
    stale, fresh = task_submit_many([item, BatchItem(pipeline="t_quiet_1", input={"n": 7}, idempotency_key="fresh")])
    assert stale.created is not None
    assert fresh.error.code == "idempotency_key_in_use"
    assert IdempotencyRecord.objects.get(key="stale").task_id == stale.task_id


def test_the_batch_holds_at_most_a_thousand_items():
    with pytest.raises(InvalidTaskInput):
        task_submit_many([{"pipeline": "t_quiet_1", "input": {}}] * (MAX_BATCH_ITEMS + 1))
    with pytest.raises(InvalidTaskInput):
        task_submit_many([])
    assert not Task.objects.exists()


def test_a_lost_batch_job_is_delivered_again_task_by_task(settings):
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = 0
    outcomes = task_submit_many([{"pipeline": "t_quiet_1", "input": {"n": n}} for n in range(3)])
    tasks = list(Task.objects.filter(pk__in=[o.task_id for o in outcomes]))
    (batch,) = {task.batch_job for task in tasks}
    assert all(delivery_job_id(task.pk, task.fencing_token, task.batch_job) == batch for task in tasks)

    assert sweep_once().redelivered == 0  # its job waits in Redis: nothing is lost
    Redis.from_url(settings.REDIS_URL).delete(get_queue().job_class.key_for(batch))  # Redis lost it
    with door_forced():
        Task.objects.filter(pk__in=[task.pk for task in tasks]).update(updated_at=timezone.now() - timedelta(seconds=5))

    assert sweep_once().redelivered == 3
    for task in Task.objects.filter(pk__in=[task.pk for task in tasks]):
        assert task.batch_job == ""
        job = get_queue().fetch_job(job_id(task.pk, task.fencing_token))
        assert job is not None and job.args == [str(task.pk)]
    assert sweep_once().redelivered == 0  # their own jobs wait now


def test_a_batch_job_runs_each_task_and_one_that_fails_harms_no_other():
    from tasks.delivery.jobs import run_tasks

    outcomes = task_submit_many([{"pipeline": "t_quiet_1", "input": {"n": n}} for n in range(3)])
    ids = [str(outcome.task_id) for outcome in outcomes]
    missing = "00000000-0000-0000-0000-000000000000"

    assert run_tasks([ids[0], missing, "not a uuid", ids[1], ids[2]]) == [
        "succeeded",
        "skipped",
        "error",
        "succeeded",
        "succeeded",
    ]
    assert Task.objects.filter(pk__in=ids, state="succeeded").count() == 3
    with pytest.raises(TypeError):
        run_tasks("not a list")
    # The job as RQ stores it: JSON, one list argument.
    (job,) = _jobs()
    assert json.loads(JSONSerializer.dumps(job.args)) == [ids]


def test_a_stopping_worker_hands_the_rest_of_a_batch_back_each_on_its_own(monkeypatch):
    import threading

    from tasks.delivery import jobs

    outcomes = task_submit_many([{"pipeline": "t_quiet_1", "input": {"n": n}} for n in range(3)])
    ids = [str(outcome.task_id) for outcome in outcomes]
    stopping = threading.Event()
    monkeypatch.setattr(jobs, "STOPPING", stopping)
    real_run_task = jobs.run_task

    def run_then_stop(task_id):
        result = real_run_task(task_id)
        stopping.set()  # the worker got SIGTERM while its first task ran
        return result

    monkeypatch.setattr(jobs, "run_task", run_then_stop)

    assert jobs.run_tasks(ids) == ["succeeded", "handed_back", "handed_back"]
    for task in Task.objects.filter(pk__in=ids[1:]):
        assert (task.state, task.batch_job, task.fencing_token) == ("queued", "", 0)
        assert get_queue().fetch_job(job_id(task.pk, 0)) is not None  # delivered on its own


# --- priorities: a batch hands its rest back when a higher queue has a job waiting ----------------------------------

# Each clocked task takes this long on the batch's clock (tests.pipelines.STEP_CLOCK): with the check at most every
# 50 ms (tasks.delivery.jobs.PRIORITY_CHECK_SECONDS), one falls due after every second task.
TASK_SECONDS = 0.03


@pytest.fixture
def step_clock(monkeypatch):
    """tasks.delivery.jobs reads the steps' clock in place of the time module's monotonic time."""
    from tasks.delivery import jobs, worker
    from tests.pipelines import STEP_CLOCK

    monkeypatch.setattr(STEP_CLOCK, "now", 0.0)
    monkeypatch.setattr(jobs, "time", STEP_CLOCK)
    monkeypatch.setattr(jobs, "_last_job_ended", None)
    monkeypatch.setattr(worker, "listened_queues", None)  # as outside a worker, whatever an earlier test made
    return STEP_CLOCK


@pytest.fixture
def llen_calls(settings):
    """How many LLEN commands Redis (this run's own server) has answered since the fixture was set up."""
    redis = Redis.from_url(settings.REDIS_URL)
    redis.config_resetstat()
    return lambda: redis.info("commandstats").get("cmdstat_llen", {}).get("calls", 0)


def _clocked_batch(pipeline: str, count: int) -> list[str]:
    outcomes = task_submit_many(
        [{"pipeline": pipeline, "input": {"n": n, "seconds": TASK_SECONDS}} for n in range(count)]
    )
    return [str(outcome.task_id) for outcome in outcomes]


def _perform_batch_job(task_ids: list[str], *, queue: str) -> list[str]:
    """The tasks' batch job as a worker runs it: taken off its queue, then performed (RQ's current job meanwhile)."""
    (batch,) = set(Task.objects.filter(pk__in=task_ids).values_list("batch_job", flat=True))
    job = get_queue(queue).fetch_job(batch)
    get_queue(queue).remove(job)
    assert job.args == [task_ids]
    return job.perform()


def test_a_batch_hands_its_rest_back_at_its_first_check_once_a_higher_queue_has_a_job(step_clock, llen_calls):
    ids = _clocked_batch("t_clocked_bulk", 10)
    critical = task_submit(pipeline="t_critical", input={})

    # The critical job waits from the start; the first check falls due 50 ms into the batch, after two tasks.
    assert _perform_batch_job(ids, queue="bulk") == ["succeeded"] * 2 + ["handed_back"] * 8
    assert llen_calls() == 2  # one check: the critical and default queues, in one pipeline
    assert Task.objects.filter(pk__in=ids[:2], state="succeeded").count() == 2
    rest = {str(task.pk): task for task in Task.objects.filter(pk__in=ids[2:])}
    assert {(task.state, task.batch_job, task.fencing_token) for task in rest.values()} == {("queued", "", 0)}
    # Each delivered on its own, behind the critical job in the worker's order of queues.
    bulk = get_queue("bulk")
    assert bulk.job_ids == [job_id(task_id, 0) for task_id in ids[2:]]
    assert all(bulk.fetch_job(job_id(task_id, 0)).args == [task_id] for task_id in ids[2:])
    assert get_queue("critical").job_ids == [job_id(critical.pk, 0)]


def test_with_nothing_waiting_above_it_a_batch_runs_whole_and_checks_at_most_every_50_ms(step_clock, llen_calls):
    ids = _clocked_batch("t_clocked_bulk", 10)
    task_submit(pipeline="t_bulk", input={})  # a job on the batch's own queue is no reason to hand back

    assert _perform_batch_job(ids, queue="bulk") == ["succeeded"] * 10
    # 0.27 s of tasks: a check before the 3rd, 5th, 7th and 9th task (not before the first: the worker's dequeue
    # found the queues above empty), each two LLENs in one round trip.
    assert step_clock.now == pytest.approx(10 * TASK_SECONDS)
    assert llen_calls() == 4 * 2
    assert Task.objects.filter(pk__in=ids, state="succeeded").count() == 10


def test_a_batch_on_the_highest_queue_or_called_directly_never_checks(step_clock, llen_calls):
    from tasks.delivery.jobs import run_tasks

    task_submit(pipeline="t_bulk", input={})
    on_critical = _clocked_batch("t_clocked_critical", 10)
    assert _perform_batch_job(on_critical, queue="critical") == ["succeeded"] * 10

    task_submit(pipeline="t_critical", input={})
    direct = _clocked_batch("t_clocked_bulk", 10)
    assert run_tasks(direct) == ["succeeded"] * 10  # no current job: no queue of its own to rank
    assert step_clock.now == pytest.approx(20 * TASK_SECONDS)
    assert llen_calls() == 0


def test_a_worker_asks_only_about_the_queues_it_takes_jobs_from(step_clock, llen_calls, monkeypatch):
    from tasks.delivery import worker

    task_submit(pipeline="t_critical", input={})  # waiting on a queue this worker never reads
    monkeypatch.setattr(worker, "listened_queues", frozenset({"default", "bulk"}))
    ids = _clocked_batch("t_clocked_bulk", 10)
    assert _perform_batch_job(ids, queue="bulk") == ["succeeded"] * 10
    assert llen_calls() == 4  # four checks of the default queue alone
    monkeypatch.setattr(worker, "listened_queues", frozenset({"bulk"}))
    ids = _clocked_batch("t_clocked_bulk", 10)
    assert _perform_batch_job(ids, queue="bulk") == ["succeeded"] * 10
    assert llen_calls() == 4  # nothing above bulk that it reads: no check at all
