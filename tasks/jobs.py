"""The engine's RQ entry point. Thin: parse, call one service. Only names in tasks.registry run in a worker."""

from __future__ import annotations

import os
import socket

from django.db import close_old_connections
from rq import get_current_job

from tasks.runner import task_run

# run_task is the engine's entry point (tasks.registry.RUN_TASK_ENTRY_POINT); other apps register theirs with
# tasks.registry.entry_point_register, and tasks.worker refuses a job naming any other function.


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
