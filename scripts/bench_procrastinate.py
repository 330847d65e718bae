"""`make bench` (engine part): Procrastinate's no-op jobs/s, the PostgreSQL-only queue the batch floor compares to.

Procrastinate (and the psycopg 3 it needs) lives in a venv of its own, ``var/bench-venvs/procrastinate``, built
on first use from pyproject's ``procrastinate-baseline`` extra: installed into the project's venv, psycopg 3
would become Django's driver there. The jobs are deferred onto a queue no worker listens to, ``processes``
workers (``procrastinate worker --concurrency 1``, one job at a time as an RQ worker) are started on another and
registered, then the jobs move to it in one UPDATE and a notification wakes the workers: the clock runs from
there until the last job succeeded (its "succeeded" event's time), as for the engine and bare RQ (worker start-up is
not in the figure).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench_db import connect, database_url, drop_database, recreate_database
from bench_processes import SCRIPTS, WORKER_START_TIMEOUT, BenchError, ManagedProcesses, baseline_venv

EXTRA = "procrastinate-baseline"
QUEUE = "bench"
DRAIN_TIMEOUT = 600
# As the engine's drains (bench_engine): polled in the database every 0.2 s, the clock stopped at the last job's
# own "succeeded" event, not at the poll that saw it.
POLL_SECONDS = 0.2


def bench_procrastinate(
    server_url: str, database: str, processes: int, jobs: int, log_dir: Path, progress: Callable[[str], None] = print
) -> float:
    """No-op jobs/s drained by ``processes`` Procrastinate workers, on a fresh database ``database``."""
    python = baseline_venv("procrastinate", EXTRA, progress)
    recreate_database(server_url, database)
    url = database_url(server_url, database)
    env = {**os.environ, "BENCH_PROCRASTINATE_DSN": url, "PYTHONPATH": str(SCRIPTS), "PYTHONUNBUFFERED": "1"}
    cli = [str(python), "-m", "procrastinate", "--app=bench_procrastinate_app.app"]
    try:
        subprocess.run([*cli, "schema", "--apply"], env=env, check=True, capture_output=True)
        defer = f"import bench_procrastinate_app as app; app.defer({jobs})"
        subprocess.run([str(python), "-c", defer], env=env, check=True, capture_output=True)
        session = connect(url)
        try:
            with session.cursor() as cursor:
                workers = ManagedProcesses(
                    [*cli, "worker", "--queues", QUEUE, "--concurrency", "1"],
                    processes,
                    env,
                    log_dir / "procrastinate-workers.log",
                    "a Procrastinate worker",
                )
                try:
                    return jobs / _drain(cursor, workers, processes, jobs)
                finally:
                    workers.stop()
        finally:
            session.close()
    finally:
        drop_database(server_url, database)


def _drain(cursor, workers: ManagedProcesses, processes: int, jobs: int) -> float:
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while _scalar(cursor, "SELECT count(*) FROM procrastinate_workers") < processes:
        workers.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{processes} Procrastinate workers did not register within {WORKER_START_TIMEOUT}s")
        time.sleep(0.05)
    time.sleep(0.5)  # as for RQ's workers: each reaches its wait for a notification
    started = time.time()
    # Moved jobs raise no insert trigger: the notification its trigger would have sent wakes the workers.
    cursor.execute(
        "UPDATE procrastinate_jobs SET queue_name = %s WHERE status = 'todo'; "
        "SELECT pg_notify('procrastinate_queue_v1#' || %s, json_build_object('type', 'job_inserted')::text)",
        [QUEUE, QUEUE],
    )
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        done = _scalar(cursor, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        if done >= jobs:
            cursor.execute("SELECT extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'")
            return float(cursor.fetchone()[0]) - started
        if _scalar(cursor, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"):
            raise BenchError(f"Procrastinate jobs failed; see {workers.log_path}")
        if time.monotonic() > deadline:
            raise BenchError(f"only {done} of {jobs} Procrastinate jobs done after {DRAIN_TIMEOUT}s")
        workers.check_alive()
        time.sleep(POLL_SECONDS)


def _scalar(cursor, sql: str) -> int:
    cursor.execute(sql)
    return cursor.fetchone()[0]
