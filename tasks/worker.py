"""The RQ worker and job classes the project's settings choose.

``SimpleWorker`` runs jobs in the worker process itself: no fork per job, and
the process keeps its Redis and PostgreSQL connections between jobs. A
killed worker loses nothing: its task's lease expires and the sweeper
re-delivers it.
"""

from __future__ import annotations

import logging

from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker, WorkerStatus

logger = logging.getLogger(__name__)


class UnregisteredEntryPoint(Exception):
    """A job named a function that is not one of the project's entry points."""


class ReliabilityJob(Job):
    """Refuses to run anything but a registered entry point."""

    def _execute(self):
        from tasks.jobs import ENTRY_POINTS

        if self.func_name not in ENTRY_POINTS:
            logger.error("refused job", extra={"event": "job_refused", "job_id": self.id, "func_name": self.func_name})
            raise UnregisteredEntryPoint(f"{self.func_name!r} is not a registered entry point")
        return super()._execute()


class ReliabilityWorker(SimpleWorker):
    """A SimpleWorker that always speaks JSON.

    django-rq's ``rqworker`` passes ``--serializer`` (pickle by default) to
    the worker; this class ignores it so no job is ever unpickled.
    """

    # RQ waits 1, 2, 4 … up to 60 s between attempts to reach a Redis that went
    # away; after a restart or a Sentinel failover (seconds) that would idle a
    # worker for up to a minute. The database holds the work, so retry often.
    max_connection_wait_time = 5.0

    def __init__(self, *args, **kwargs) -> None:
        kwargs["serializer"] = JSONSerializer
        kwargs.setdefault("job_class", ReliabilityJob)
        super().__init__(*args, **kwargs)

    def _shutdown(self) -> None:
        # An idle worker's SIGTERM handler raises StopRequested wherever the main thread is. Raised inside a
        # finalizer (a connection pool's __del__ during registry cleaning) it is printed and ignored, and
        # RQ's loop, which only checks the flag for a busy worker, waited for its next job. With the flag
        # set too, the loop stops at its next check.
        if self.get_state() != WorkerStatus.BUSY:
            self._stop_requested = True
        super()._shutdown()
