"""The RQ worker and job classes the project's settings choose.

``SimpleWorker`` runs jobs in the worker process itself: no fork per job, and
the process keeps its Redis and PostgreSQL connections between jobs. A
killed worker loses nothing: its task's lease expires and the sweeper
re-delivers it.

Anyone who can write to Redis can enqueue a job, so a worker runs only what
the project enqueues itself: a registered entry point, with no callbacks and
no dependencies (the project's jobs have neither). Anything else is refused
before any of it is imported, and a refused job's callbacks never run.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

from django.utils.module_loading import import_string
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.timeouts import UnixSignalDeathPenalty
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from tasks import registry
from tasks.exceptions import ReliabilityError

logger = logging.getLogger(__name__)


class RefusedJob(ReliabilityError):
    """A job the workers will not run: something in it is not the project's."""

    code = "job_refused"


class UnregisteredEntryPoint(RefusedJob):
    """A job named a function that is not one of the project's entry points."""

    code = "unregistered_entry_point"


class ReliabilityJob(Job):
    """Runs only a registered entry point, and never a callback."""

    def _deserialize_data(self):
        super()._deserialize_data()
        # A job enqueued by an earlier release names an entry point by its old path: run it by its current one.
        self._func_name = registry.entry_point_current(self._func_name)

    def refusal(self) -> RefusedJob | None:
        """Why this job may not run (the error to fail it with), or None when it is one of the project's."""
        if not registry.entry_point_allowed(self.func_name):
            return UnregisteredEntryPoint(f"{self.func_name!r} is not a registered entry point")
        callbacks = [
            name
            for name in (self._success_callback_name, self._failure_callback_name, self._stopped_callback_name)
            if name
        ]
        if callbacks:
            return RefusedJob(f"callbacks {callbacks!r}: the project's jobs have none")
        if self._dependency_ids:
            return RefusedJob(f"dependencies {list(self._dependency_ids)!r}: the project's jobs have none")
        # A webhook is a POST from the worker to any URL the job names; the others change how RQ finishes
        # a job (ReliabilityWorker.handle_job_success leaves them out): the project's jobs have none of them.
        if self.webhooks:
            return RefusedJob("webhooks: the project's jobs have none")
        if self.has_rate_limit or self.repeats_left or self.group_id:
            return RefusedJob("a rate limit, repeats or a group: the project's jobs have none")
        return None

    @property
    def finishes_lean(self) -> bool:
        """Whether RQ has nothing to keep of this job once it returned: no result, no repeat, nothing after it."""
        return self.result_ttl == 0 and not self.repeats_left and not self.has_rate_limit and not self.group_id

    def _execute(self):
        refused = self.refusal()
        if refused is not None:
            logger.error(
                "refused job",
                extra={
                    "event": "job_refused",
                    "job_id": self.id,
                    "func_name": self.func_name,
                    "code": refused.code,
                    "reason": refused.message,
                },
            )
            raise refused
        return super()._execute()

    # RQ imports and runs a job's callbacks after the job returns or raises,
    # when it is stopped, and when a worker cleans up an abandoned job, even
    # one whose function was refused. The project's jobs have none: whatever
    # callback a job names, none is imported or run.
    @property
    def success_callback(self):
        return None

    @property
    def failure_callback(self):
        return None

    @property
    def stopped_callback(self):
        return None

    # RQ sends a job's webhooks when it finishes or fails, a refused one too: none is ever sent.
    def send_webhooks(self, status, *, exc_string=None) -> None:
        return None


# How often an RQ scheduler process checks that the worker that forked it is still there.
ORPHAN_CHECK_SECONDS = 1.0
_fork_hook_installed = False


def _scheduler_leaves_with_its_worker() -> None:
    """In a process forked by the worker (RQ's scheduler): stop it once the worker is gone.

    RQ runs the scheduler in a child process that outlives a worker killed
    with SIGKILL (the OOM killer, ``kill -9``, a chaos test) and goes on
    heartbeating, holding the scheduler lock: an orphan nobody supervises,
    running the code of the release it was forked from. The scheduler stops
    cleanly on SIGTERM (it releases its lock), so the orphan sends itself one.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


# Set once the worker was asked to stop (a warm shutdown lets the current job finish): a batch's job
# (tasks.delivery.jobs.run_tasks) hands back the tasks it has not started instead of running them all first.
STOPPING = threading.Event()
# The queues this process's worker takes jobs from (None outside a worker): a batch's job hands its rest back
# only for a job waiting on one of them (tasks.delivery.jobs), since a job on a queue this worker never reads would not
# be its next one anyway.
listened_queues: frozenset[str] | None = None

# How often, at most, a worker refreshes its liveness in Redis. RQ's loop sends a heartbeat (three unpipelined
# commands) three times per job and once more in each job's start; here a busy worker's rides in a job's start
# at most this often, and an idle one blocks in BLPOP and beats once per wait (RQ's own rhythm). So `rq info`
# and the console's queue page show a busy worker's last heartbeat at most this old. The worker's key lives for
# its worker_ttl (420 s by default) past the last beat, whatever this is.
WORKER_HEARTBEAT_SECONDS = 5.0


class JobTimeout(UnixSignalDeathPenalty):
    """RQ's job timeout (SIGALRM), left out for a job that has none.

    Every delivery of the engine is enqueued without one (``NO_JOB_TIMEOUT``): each of its steps runs under its
    own time limit (``tasks.execution.timeouts``), whose handler then stays in place from one step to the next instead
    of being swapped with RQ's around every step.
    """

    @property
    def _armed(self) -> bool:
        return self._timeout is not None and self._timeout > 0

    def setup_death_penalty(self) -> None:
        if self._armed:
            super().setup_death_penalty()

    def cancel_death_penalty(self) -> None:
        if self._armed:
            super().cancel_death_penalty()


# RQ's lines after every job (its "Job OK", what became of its result): the engine's own events say what became
# of the task, with its ids, so these two go to DEBUG (``rqworker -v 2`` shows them). The line of the job's
# dequeue stays, with its queue: which queue a worker took its next job from.
_FINISHED_JOB_LINES = frozenset(
    {
        "Worker %s: job %s result discarded immediately",
        "Worker %s: job %s result is kept for %s seconds",
        "Successfully completed %s job in %ss on worker %s",
        "Successfully completed job %s in %ss on worker %s",
    }
)
_DEQUEUED_OR_OK_LINE = "Worker %s: %s: %s (%s)"  # RQ writes its dequeue and its "Job OK" with the same text


class _WorkerLog(logging.LoggerAdapter):
    """RQ's worker logger, with its lines after every job at DEBUG (``_FINISHED_JOB_LINES``): each line is a
    record made, formatted and written, and a 10-step task's job wrote four of them, a 1-step task's the same."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    @property
    def level(self) -> int:  # RQ reads it to start its scheduler at the worker's level
        return self.logger.level

    def process(self, msg, kwargs):
        return msg, kwargs

    def info(self, msg, *args, **kwargs) -> None:
        if msg in _FINISHED_JOB_LINES or (msg == _DEQUEUED_OR_OK_LINE and len(args) == 4 and "Job OK" in str(args[2])):
            self.logger.debug(msg, *args, **kwargs)
        else:
            self.logger.info(msg, *args, **kwargs)


class ReliabilityWorker(SimpleWorker):
    """A SimpleWorker that always speaks JSON and always runs ``ReliabilityJob``, with a lean loop.

    django-rq's ``rqworker`` passes ``--serializer`` (pickle by default) and
    ``--job-class`` to the worker; this class ignores both, so no job is ever
    unpickled and every job goes through ``ReliabilityJob``'s checks.

    The loop talks to Redis four times per job where RQ's talks twenty-seven
    (tests/acceptance/test_round_trips.py counts them): the dequeue, the
    job's fetch, its start and its finish. Heartbeats (in a job's start or
    on their own) and the suspension check at most every
    ``WORKER_HEARTBEAT_SECONDS``, the worker's state written only when it changes (busy and
    idle ride in the job's pipelines), the execution and the job's start in
    one pipeline, and a job with nothing to keep (``finishes_lean``)
    finished and deleted in one pipeline, without the dependents' WATCH and
    the registry reads that RQ's general path makes for any job.
    """

    # RQ waits 1, 2, 4 … up to 60 s between attempts to reach a Redis that went
    # away; after a restart or a Sentinel failover (seconds) that would idle a
    # worker for up to a minute. The database holds the work, so retry often.
    max_connection_wait_time = 5.0
    death_penalty_class = JobTimeout

    def __init__(self, *args, **kwargs) -> None:
        global _fork_hook_installed
        if not _fork_hook_installed:
            # A SimpleWorker forks nothing but its scheduler.
            os.register_at_fork(after_in_child=_scheduler_leaves_with_its_worker)
            _fork_hook_installed = True
        # The state the last job's finishing pipeline wrote for the worker (set_state needs no round trip for it).
        self._state_written: str | None = None
        # When each throttled chore (``_due``) was last done.
        self._done_at: dict[str, float] = {}
        kwargs["serializer"] = JSONSerializer
        if not _is_reliability_job_class(kwargs.get("job_class")):
            kwargs["job_class"] = ReliabilityJob
        super().__init__(*args, **kwargs)
        self.log = _WorkerLog(self.log)
        global listened_queues
        listened_queues = frozenset(self.queue_names())
        # Registries (and their clean-up of abandoned jobs) read jobs with their queue's class.
        for queue in self.queues:
            if not _is_reliability_job_class(queue.job_class):
                queue.job_class = self.job_class

    def _due(self, what: str) -> bool:
        """Whether ``what`` was last done ``WORKER_HEARTBEAT_SECONDS`` ago or more (or never); if so, done now."""
        done_at = self._done_at.get(what)
        if done_at is not None and time.monotonic() - done_at < WORKER_HEARTBEAT_SECONDS:
            return False
        self._done_at[what] = time.monotonic()
        return True

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            self._done_at["heartbeat"] = time.monotonic()
            return
        if timeout is None and not self._due("heartbeat"):
            return
        with self.connection.pipeline(transaction=False) as batch:
            super().heartbeat(timeout, pipeline=batch)
            batch.execute()
        self._done_at["heartbeat"] = time.monotonic()

    def check_for_suspension(self, burst: bool) -> None:
        # RQ asks Redis whether workers are suspended (`rq suspend`) before every job: here at most every
        # heartbeat interval, so a suspension stops new jobs within that long.
        if self._due("suspension read"):
            super().check_for_suspension(burst)

    def prepare_execution(self, job) -> Execution:
        # RQ writes the execution and the worker's busy state in a pipeline of its own, then the job's start in a
        # second one (prepare_job_execution), with nothing read between: here the first waits for the second.
        # Not a MULTI/EXEC transaction: only this worker writes these keys (RQ's readers take them as they
        # find them), and a transaction doubles the replies to parse.
        pipeline = self.connection.pipeline(transaction=False)
        execution = Execution.create(job, self.get_heartbeat_ttl(job), pipeline=pipeline, worker_name=self.name)
        self.executions[execution.id] = execution
        self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
        self._execution_pipeline = pipeline
        return execution

    def prepare_job_execution(self, job, remove_from_intermediate_queue: bool = False) -> None:
        pipeline, self._execution_pipeline = getattr(self, "_execution_pipeline", None), None
        if pipeline is None:
            super().prepare_job_execution(job, remove_from_intermediate_queue)
            return
        # RQ's prepare_job_execution, in the execution's pipeline, less two things. The worker's heartbeat (a
        # field and two TTLs) rides in it at most every WORKER_HEARTBEAT_SECONDS, as outside a job: the worker's
        # key was given minutes to live by the last one. RQ's job.heartbeat writes the job's last_heartbeat, which
        # prepare_for_execution writes again right after it.
        with pipeline:
            if self._due("heartbeat"):
                self.heartbeat(self.get_heartbeat_ttl(job), pipeline=pipeline)
            job.prepare_for_execution(self.name, pipeline=pipeline)
            pipeline.persist(job.key)
            if remove_from_intermediate_queue:
                pipeline.lrem(Queue(job.origin, connection=self.connection).intermediate_queue_key, 1, job.id)
            pipeline.execute()
        self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")

    def set_state(self, state: str, pipeline=None) -> None:
        # RQ sets "idle" twice between two jobs (after one, before the next dequeue), each a round trip; the
        # first is already in Redis when the job's finishing pipeline wrote it (cleanup_execution).
        if pipeline is None and (state == self._state or state == self._state_written):
            self._state = state
            return
        self._state_written = None
        super().set_state(state, pipeline=pipeline)

    def cleanup_execution(self, job, pipeline, execution=None) -> None:
        super().cleanup_execution(job, pipeline, execution)
        # One job at a time: once its execution is gone the worker is idle, written in the same pipeline. Only
        # written: the worker stays busy to itself until RQ is done with the job (SimpleWorker.execute_job sets
        # it idle then). A SIGTERM in between is a warm shutdown of a busy worker (stop after this job), not
        # StopRequested raised inside the job's finishing pipeline (RQ would record the done job as failed).
        pipeline.hset(self.key, "state", WorkerStatus.IDLE)
        self._state_written = WorkerStatus.IDLE

    def handle_execution_ended(self, job, queue, heartbeat_ttl: int) -> None:
        # RQ also beats the job here, a round trip just before the job's record is finished or failed.
        job.ended_at = now()

    def handle_job_success(self, job, queue, started_job_registry, execution) -> None:
        if not (isinstance(job, ReliabilityJob) and job.finishes_lean):
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        # What RQ's general path ends with for a job kept for 0 seconds, in one pipeline: the counts, the
        # execution's records, the job's keys. Nothing can depend on the job (a dependent is refused when it
        # is run), so no dependents are read or moved.
        with self.connection.pipeline(transaction=False) as pipeline:  # as in prepare_execution
            self.increment_successful_job_count(pipeline=pipeline)
            self.increment_total_working_time(job.ended_at - job.started_at, pipeline)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            pipeline.delete(
                job.key, job.dependents_key, job.dependencies_key, Result.get_key(job.id), job.execution_registry.key
            )
            pipeline.execute()
        job._status = JobStatus.FINISHED

    def handle_payload(self, message) -> None:
        """RQ's worker commands, plus ``cancel-task``: interrupt the waiting step of a task this worker runs."""
        from tasks.execution import interrupts
        from tasks.lifecycle.cancellation import CANCEL_COMMAND

        try:
            payload = json.loads(message["data"])
        except (TypeError, ValueError, KeyError):
            return
        if isinstance(payload, dict) and payload.get("command") == CANCEL_COMMAND:
            task_id = payload.get("task_id")
            if isinstance(task_id, str):
                interrupts.cancel_attempt(task_id)
            return
        super().handle_payload(message)

    def request_stop(self, signum, frame) -> None:
        STOPPING.set()
        super().request_stop(signum, frame)

    def unsubscribe(self) -> None:
        # RQ's unsubscribe sends UNSUBSCRIBE, then stops the thread that reads the worker's channel (redis-py 8
        # waits for it without a timeout). The thread reads the reply; when the stop comes only after that (a
        # busy or slow machine), it has gone back to a read of up to 60 s (RQ's sleep_time) for a message that
        # never comes, and the worker's exit hung that long. Told to stop first, the thread ends with the read
        # the reply ends; it is waited for 1 s at most, as RQ then does.
        thread = self.pubsub_thread
        if not thread:
            return
        self.log.info("Worker %s: unsubscribing from channel %s", self.name, self.pubsub_channel_name)
        _stop_without_waiting(thread)
        self.pubsub.unsubscribe()
        thread.join(timeout=1)
        self.pubsub.close()

    def _shutdown(self) -> None:
        # An idle worker's SIGTERM handler raises StopRequested wherever the main thread is. Raised inside a
        # finalizer (a connection pool's __del__ during registry cleaning) it is printed and ignored, and
        # RQ's loop, which only checks the flag for a busy worker, waited for its next job. With the flag
        # set too, the loop stops at its next check.
        if self.get_state() != WorkerStatus.BUSY:
            self._stop_requested = True
        super()._shutdown()


def _stop_without_waiting(thread) -> None:
    """Tell a redis-py ``PubSubWorkerThread`` to stop after its current read, without waiting for it."""
    try:
        thread.stop(timeout=0)  # redis-py 8: stop() waits for the thread unless given a timeout
    except TypeError:
        thread.stop()  # earlier releases: stop() only tells it


def _is_reliability_job_class(job_class) -> bool:
    if isinstance(job_class, str):
        job_class = import_string(job_class)
    return isinstance(job_class, type) and issubclass(job_class, ReliabilityJob)
