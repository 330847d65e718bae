"""Workers run the project's jobs only: a job with a foreign function, callback or dependency runs nothing.

Issue #12, finding 7: a job whose function was refused still had its
``on_failure`` callback run (``builtins.print``). Here an attacker with
access to Redis enqueues jobs straight through rq (JSON, as the workers
read), whose callbacks leave a file behind if they ever run; a real worker
process takes them.
"""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from redis import Redis
from rq import Callback, Queue
from rq.job import JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from tasks.delivery.worker import ReliabilityJob
from tasks.registry import RUN_TASK_ENTRY_POINT
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

GADGET = "tests.rq_trace.leave_trace"
ALL_CALLBACKS = {"on_success": Callback(GADGET), "on_failure": Callback(GADGET), "on_stopped": Callback(GADGET)}


@pytest.fixture
def attacker_queue(clean_redis):
    """The engine's queue as an attacker sees it: plain rq, no project code."""
    return Queue(settings.RELIABILITY_QUEUE, connection=Redis.from_url(settings.REDIS_URL), serializer=JSONSerializer)


def ended(job):
    def check():
        status = job.get_status(refresh=True)
        return status if status in (JobStatus.FINISHED, JobStatus.FAILED) else None

    return check


def test_foreign_callbacks_and_dependencies_never_run(attacker_queue, start_workers, tmp_path):
    meta = {"trace_dir": str(tmp_path)}
    refused_function = attacker_queue.enqueue_call(
        "os.getcwd", job_id="refused-function", meta=meta, failure_ttl=600, on_failure=Callback(GADGET)
    )
    # What the finding saw: the refused function's on_failure printed the job, the Redis client and the error.
    printed = attacker_queue.enqueue_call(
        "os.getcwd", job_id="printed", failure_ttl=600, on_failure=Callback("builtins.print")
    )
    allowed_function = attacker_queue.enqueue_call(
        RUN_TASK_ENTRY_POINT,
        args=(str(uuid.uuid4()),),
        job_id="allowed-function",
        meta=meta,
        failure_ttl=600,
        **ALL_CALLBACKS,
    )
    first = attacker_queue.enqueue_call(RUN_TASK_ENTRY_POINT, args=(str(uuid.uuid4()),), job_id="first")
    dependent = attacker_queue.enqueue_call(
        RUN_TASK_ENTRY_POINT, args=(str(uuid.uuid4()),), job_id="dependent", depends_on=first, failure_ttl=600
    )
    pool = start_workers(1)

    for job in (refused_function, printed, allowed_function, first):
        wait_for(ended(job), timeout=30, message=f"job {job.id} to end")
    wait_for(ended(dependent), timeout=30, message="the dependent job to end")
    assert sorted(path.name for path in tmp_path.iterdir()) == [], pool.logs()
    assert "<redis.client.Redis(" not in pool.logs()  # what print(job, connection, *exc_info) writes
    assert first.get_status(refresh=True) == JobStatus.FINISHED  # one of ours, as the engine enqueues it
    for job, reason in (
        (refused_function, "'os.getcwd' is not a registered entry point"),
        (printed, "'os.getcwd' is not a registered entry point"),
        (allowed_function, "callbacks ['tests.rq_trace.leave_trace', 'tests.rq_trace.leave_trace', 'tests.rq_trace"),
        (dependent, "dependencies ['first']: the project's jobs have none"),
    ):
        assert job.get_status(refresh=True) == JobStatus.FAILED, job.id
        assert reason in (job.latest_result().exc_string or ""), job.id


def test_cleaning_up_an_abandoned_job_runs_none_of_its_callbacks(attacker_queue, tmp_path):
    job = attacker_queue.enqueue_call(
        "os.getcwd", job_id="abandoned", meta={"trace_dir": str(tmp_path)}, **ALL_CALLBACKS
    )
    job.set_status(JobStatus.STARTED)
    registry = StartedJobRegistry(queue=attacker_queue, job_class=ReliabilityJob, serializer=JSONSerializer)
    registry.connection.zadd(registry.key, {f"{job.id}:gone": 1})  # its worker's heartbeat stopped long ago
    registry.cleanup()
    assert list(tmp_path.iterdir()) == []
    assert ReliabilityJob.fetch(job.id, connection=attacker_queue.connection, serializer=JSONSerializer).refusal()


def test_a_job_naming_a_webhook_or_repeats_is_refused_and_calls_nobody(attacker_queue, start_workers):
    from rq import Repeat
    from rq.webhook import Webhook

    from tests.webhook_receiver import WebhookReceiver

    receiver = WebhookReceiver()
    try:
        # A webhook is a request from inside the worker's network to any URL the job names.
        hooked = attacker_queue.enqueue_call(
            RUN_TASK_ENTRY_POINT,
            args=(str(uuid.uuid4()),),
            job_id="hooked",
            failure_ttl=600,
            webhooks=[
                Webhook(receiver.url, "finished", method="POST"),
                Webhook(receiver.url, "failed", method="POST"),
            ],
        )
        repeated = attacker_queue.enqueue_call(
            RUN_TASK_ENTRY_POINT,
            args=(str(uuid.uuid4()),),
            job_id="repeated",
            failure_ttl=600,
            repeat=Repeat(times=3, interval=0),
        )
        # One of ours, as the engine enqueues it (kept 0 seconds): finished, and gone at once.
        ours = attacker_queue.enqueue_call(RUN_TASK_ENTRY_POINT, args=(str(uuid.uuid4()),), job_id="ours", result_ttl=0)
        pool = start_workers(1)
        for job in (hooked, repeated):
            wait_for(ended(job), timeout=30, message=f"job {job.id} to end")
        wait_for(lambda: not attacker_queue.connection.exists(ours.key), timeout=30, message="our job to finish")
        for job, reason in ((hooked, "webhooks"), (repeated, "repeats")):
            assert job.get_status(refresh=True) == JobStatus.FAILED, pool.logs()
            assert reason in (job.latest_result().exc_string or ""), job.id
        assert receiver.all() == [], pool.logs()
        assert attacker_queue.connection.keys(f"rq:*{ours.id}*") == []  # no key of the finished job is left
    finally:
        receiver.stop()
