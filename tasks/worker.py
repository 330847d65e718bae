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
from rq.job import Job
from rq.serializers import JSONSerializer
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
        return None

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


class ReliabilityWorker(SimpleWorker):
    """A SimpleWorker that always speaks JSON and always runs ``ReliabilityJob``.

    django-rq's ``rqworker`` passes ``--serializer`` (pickle by default) and
    ``--job-class`` to the worker; this class ignores both, so no job is ever
    unpickled and every job goes through ``ReliabilityJob``'s checks.
    """

    # RQ waits 1, 2, 4 … up to 60 s between attempts to reach a Redis that went
    # away; after a restart or a Sentinel failover (seconds) that would idle a
    # worker for up to a minute. The database holds the work, so retry often.
    max_connection_wait_time = 5.0

    def __init__(self, *args, **kwargs) -> None:
        global _fork_hook_installed
        if not _fork_hook_installed:
            # A SimpleWorker forks nothing but its scheduler.
            os.register_at_fork(after_in_child=_scheduler_leaves_with_its_worker)
            _fork_hook_installed = True
        kwargs["serializer"] = JSONSerializer
        if not _is_reliability_job_class(kwargs.get("job_class")):
            kwargs["job_class"] = ReliabilityJob
        super().__init__(*args, **kwargs)
        # Registries (and their clean-up of abandoned jobs) read jobs with their queue's class.
        for queue in self.queues:
            if not _is_reliability_job_class(queue.job_class):
                queue.job_class = self.job_class

    def handle_payload(self, message) -> None:
        """RQ's worker commands, plus ``cancel-task``: interrupt the waiting step of a task this worker runs."""
        from tasks import interrupts
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

    def _shutdown(self) -> None:
        # An idle worker's SIGTERM handler raises StopRequested wherever the main thread is. Raised inside a
        # finalizer (a connection pool's __del__ during registry cleaning) it is printed and ignored, and
        # RQ's loop, which only checks the flag for a busy worker, waited for its next job. With the flag
        # set too, the loop stops at its next check.
        if self.get_state() != WorkerStatus.BUSY:
            self._stop_requested = True
        super()._shutdown()


def _is_reliability_job_class(job_class) -> bool:
    if isinstance(job_class, str):
        job_class = import_string(job_class)
    return isinstance(job_class, type) and issubclass(job_class, ReliabilityJob)
