"""RQ entry points. Thin: parse, call one service. Only names registered here may run in a worker."""

from __future__ import annotations

import os
import socket

from django.db import close_old_connections
from rq import get_current_job

from tasks.delivery import RUN_TASK_ENTRY_POINT
from tasks.runner import task_run

# Entry points a worker will execute; any other function name in a job is refused (tasks.worker).
# Other apps add theirs with entry_point_register from their AppConfig.ready().
ENTRY_POINTS: set[str] = {RUN_TASK_ENTRY_POINT}


def entry_point_register(name: str) -> None:
    """Allow workers to run the function ``name`` (a dotted path), e.g. a console's background job."""
    ENTRY_POINTS.add(name)


def worker_identity() -> str:
    """``<worker name>@<host>:<pid>``: the lease owner a worker writes into the tasks it holds."""
    job = get_current_job()
    worker = job.worker_name if job is not None and job.worker_name else "worker"
    return f"{worker}@{socket.gethostname()}:{os.getpid()}"


def run_task(task_id: str) -> str:
    # Workers live long: drop a connection the database closed (restart,
    # pg_terminate_backend) before using it, as a web request would.
    close_old_connections()
    return task_run(task_id=str(task_id), worker=worker_identity())
