"""`make bench` (memory part): a worker's resident memory while it drains 10,000 tasks, to show whether it grows.

Against a dedicated migrated database (``rc_bench_memory``, dropped at the end unless ``--keep``) and Redis
database 14, with ``RELIABILITY_ENABLE_BENCH_PIPELINES=1``: 10,000 ``bench_noop_1`` tasks are submitted and
held back, one ``manage.py rqworker`` process (the project's ``SimpleWorker``: tasks run in the worker process
itself) is started and registered, then the tasks are released. The worker's ``VmRSS`` (resident now) and
``VmHWM`` (the peak so far) are read from ``/proc/<pid>/status`` once it is idle after start-up and each time
another 1,000 tasks have succeeded (the count when read may be a few past the mark: the worker is not paused).
MB here are /proc's kB divided by 1024.

It is a benchmark, not a test: there is no floor, the figures are for comparing runs. ``run(...)`` does the work
and returns the results; ``PART.main()`` is the command line.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench_db import connect, database_url, drop_database
from bench_part import REDIS_URL_OPTION, Option, Part, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ENGINE_QUEUE,
    WORKER_ARGV,
    BenchError,
    ManagedProcesses,
    QueueHold,
    count_succeeded,
    create_migrated_database,
    log_directory,
    project_env,
    redis_connection,
    submit_tasks,
    wait_registered,
)

DEFAULT_OUTPUT = BENCH_DIR / "memory.json"
PIPELINE = "bench_noop_1"
POLL_SECONDS = 0.02
# A drain that makes no progress for this long is stuck, however many tasks are left.
STALL_TIMEOUT = 60


OPTIONS = (
    Option("tasks", type=positive_int, default=10_000, help="bench_noop_1 tasks to drain"),
    Option("every", type=positive_int, default=1_000, help="read the memory every N tasks"),
    Option("database", default="rc_bench_memory", help="the memory part's database"),
    REDIS_URL_OPTION,
)


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now (``VmRSS``) and at its peak so far (``VmHWM``), in MB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mb": found["VmRSS"], "peak_mb": found["VmHWM"]}


def _drain_and_read(url: str, connection, batch: str, tasks: int, every: int, workers: ManagedProcesses) -> dict:
    """Release the held tasks to the started worker; its memory when idle and at every ``every`` tasks."""
    pid = workers.processes[0].pid
    wait_registered(connection, ENGINE_QUEUE, 1, workers)
    readings = [{"tasks": 0, **memory_mb(pid)}]
    marks = [*range(every, tasks, every), tasks]
    database = connect(url)
    try:
        with database.cursor() as cursor:
            started = time.perf_counter()
            QueueHold(connection, ENGINE_QUEUE).release()
            done, progressed_at = 0, time.monotonic()
            while marks:
                count = count_succeeded(cursor, PIPELINE, batch)
                if count >= marks[0]:
                    # The worker goes on meanwhile: the reading is noted with the count it followed.
                    reading = memory_mb(pid)
                    while marks and count >= marks[0]:
                        readings.append({"tasks": marks.pop(0), "counted": count, **reading})
                if count > done:
                    done, progressed_at = count, time.monotonic()
                elif time.monotonic() - progressed_at > STALL_TIMEOUT:
                    raise BenchError(
                        f"no task finished for {STALL_TIMEOUT}s ({done} of {tasks}); see {workers.log_path}"
                    )
                workers.check_alive()
                time.sleep(POLL_SECONDS)
            seconds = time.perf_counter() - started
    finally:
        database.close()
    return {"readings": readings, "drain_seconds": round(seconds, 1)}


def run(
    *,
    tasks: int = 10_000,
    every: int = 1_000,
    database: str = "rc_bench_memory",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Drain ``tasks`` tasks with one worker, reading its memory every ``every``; write ``output``; return it."""
    if tasks < 1 or every < 1:
        raise BenchError("the task count and the reading interval must be positive integers")
    log_dir = log_directory(output)
    url = database_url(server_url, database)
    env = project_env(url, redis_url)
    connection = redis_connection(redis_url)
    started = time.monotonic()
    workers = None
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        connection.flushdb()
        batch = uuid.uuid4().hex
        progress(f"bench: submitting {tasks:,} {PIPELINE} tasks")
        submit_tasks(env, PIPELINE, tasks, batch)
        QueueHold(connection, ENGINE_QUEUE).hold(tasks)
        workers = ManagedProcesses(WORKER_ARGV, 1, env, log_dir / "memory-worker.log")
        drained = _drain_and_read(url, connection, batch, tasks, every, workers)
    finally:
        if workers is not None:
            workers.stop()
        connection.flushdb()
        connection.close()
        if not keep:
            drop_database(server_url, database)

    readings = drained["readings"]
    first, last = readings[1], readings[-1]
    progress(
        f"bench: worker RSS idle {readings[0]['rss_mb']} MB, after {first['tasks']:,} tasks {first['rss_mb']} MB, "
        f"after {last['tasks']:,} {last['rss_mb']} MB (peak {last['peak_mb']} MB)"
    )
    figures = {
        "memory.worker_rss_idle": {"value": readings[0]["rss_mb"], "unit": "MB"},
        f"memory.worker_rss_after_{first['tasks']}": {"value": first["rss_mb"], "unit": "MB"},
        f"memory.worker_peak_after_{first['tasks']}": {"value": first["peak_mb"], "unit": "MB"},
        f"memory.worker_rss_after_{last['tasks']}": {"value": last["rss_mb"], "unit": "MB"},
        f"memory.worker_peak_after_{last['tasks']}": {"value": last["peak_mb"], "unit": "MB"},
    }
    results = {
        "figures": figures,
        "floors": [],
        "readings": readings,
        "tasks": tasks,
        "every": every,
        "drain_seconds": drained["drain_seconds"],
        "seconds": round(time.monotonic() - started, 1),
    }
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    readings = results["readings"]
    header = f"{'tasks done':>10} {'RSS MB':>8} {'peak MB':>8}"
    lines = [
        f"Worker memory: one worker drains {results['tasks']:,} {PIPELINE} tasks "
        f"(in {results['drain_seconds']:.0f} s; part {results['seconds']:.0f} s), VmRSS and VmHWM from /proc:",
        header,
        "-" * len(header),
    ]
    for reading in readings:
        label = "idle" if reading["tasks"] == 0 else f"{reading['tasks']:,}"
        lines.append(f"{label:>10} {reading['rss_mb']:>8.1f} {reading['peak_mb']:>8.1f}")
    if len(readings) > 2:
        first, last = readings[1], readings[-1]
        lines.append(
            f"from {first['tasks']:,} to {last['tasks']:,} tasks: RSS {last['rss_mb'] - first['rss_mb']:+.1f} MB, "
            f"peak {last['peak_mb'] - first['peak_mb']:+.1f} MB"
        )
    return "\n".join(lines)


PART = Part(
    name="memory", run=run, format_table=format_table, options=OPTIONS, default_output=DEFAULT_OUTPUT, doc=__doc__
)

if __name__ == "__main__":
    sys.exit(PART.main())
