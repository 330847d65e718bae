"""A warm shutdown (SIGTERM) that comes while the worker finishes a job: the job stays done, the worker stops.

The lean loop writes the worker's "idle" into the job's finishing pipeline (``ReliabilityWorker.cleanup_execution``).
Were the worker idle to itself from then on, a SIGTERM before that pipeline ran would raise RQ's StopRequested
inside it (RQ raises it for an idle worker) and RQ would record the finished job as failed.
"""

from __future__ import annotations

import signal
import threading

import pytest
from rq.registry import FailedJobRegistry
from rq.worker import WorkerStatus

from tasks.delivery.enqueue import get_queue, job_id, redis_client
from tasks.delivery.worker import STOPPING, ReliabilityWorker
from tasks.models import Task, TaskState
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class _SigtermWhileFinishing(ReliabilityWorker):
    """Receives SIGTERM (its own handler, called as the signal would call it) between the job's clean-up and the
    pipeline that finishes it."""

    signalled = 0

    def cleanup_execution(self, job, pipeline, execution=None) -> None:
        super().cleanup_execution(job, pipeline, execution)
        self.signalled += 1
        self.request_stop(signal.SIGTERM, None)


def test_a_sigterm_while_a_job_finishes_leaves_it_finished_and_stops_the_worker(clean_redis):
    first = task_submit(pipeline="t_quiet_1", input={"n": 1})
    second = task_submit(pipeline="t_quiet_1", input={"n": 2})
    queue = get_queue("default")
    worker = _SigtermWhileFinishing([queue], connection=redis_client())
    try:
        worker.work(burst=True)
    finally:
        STOPPING.clear()

    assert FailedJobRegistry(queue=get_queue("default")).get_job_ids() == []
    assert worker.signalled == 1
    assert Task.objects.get(pk=first.pk).state == TaskState.SUCCEEDED
    # A warm shutdown: the worker stopped after the job in hand, the other task's job is still queued.
    assert Task.objects.get(pk=second.pk).state == TaskState.QUEUED
    assert queue.job_ids == [job_id(second.pk, 0)]
    # The job kept nothing (finished lean) and the worker's record says idle, as RQ's own loop would leave it.
    assert not queue.connection.exists(f"rq:job:{job_id(first.pk, 0)}")
    assert worker.get_state() == WorkerStatus.IDLE


def test_a_worker_leaves_its_channel_at_once_when_the_reader_got_the_unsubscribe_reply_first(clean_redis):
    # A worker's exit ends with leaving its channel (RQ's unsubscribe): an UNSUBSCRIBE, whose reply the thread
    # reading the channel receives, then that thread stopped. Here the reply is read before the stop, as on a
    # busy machine: the reader has gone back to its next read (RQ's: up to 60 s) when told to stop, and the
    # worker waited for it (redis-py 8's stop waits), its exit hung in CI for as long.
    worker = ReliabilityWorker([get_queue("default")], connection=redis_client())
    worker.subscribe()
    pubsub, reader = worker.pubsub, worker.pubsub_thread
    send_unsubscribe = pubsub.unsubscribe

    def unsubscribe_and_let_the_reader_read_the_reply(*args, **kwargs):
        sent = send_unsubscribe(*args, **kwargs)
        wait_for(lambda: not pubsub.subscribed, timeout=10, message="the reader to read the UNSUBSCRIBE's reply")
        return sent

    pubsub.unsubscribe = unsubscribe_and_let_the_reader_read_the_reply
    left = threading.Event()
    threading.Thread(target=lambda: (worker.unsubscribe(), left.set()), daemon=True).start()
    wait_for(left.is_set, timeout=10, message="the worker to leave its channel")
    assert not reader.is_alive()
