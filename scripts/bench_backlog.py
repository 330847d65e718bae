"""`make bench` (backlog part): how long one sweep takes with 100,000 tasks queued, and with none.

Against a dedicated migrated database (``rc_bench_backlog``, dropped at the end unless ``--keep``) and Redis
database 14 (flushed before and after): for each size (0, then ``--tasks``), a child process with the project's
settings makes that many QUEUED ``bench_noop_1`` tasks with their jobs waiting in the queue (``devtools.backlog``:
set-based, as deliveries leave them), the newest one second past the redelivery grace, the fifth oldest without
its job (lost). It runs ``ANALYZE`` (as autovacuum would after such an insert), then times ``--sweeps`` calls of
``tasks.delivery.sweeper.sweep_once()`` back to back, as the sweeper makes them: the first re-delivers the lost job,
every one checks every queued task against Redis. No worker runs, so the backlog stays as deep.

It is a benchmark, not a test: the floors (the lost job delivered again by the first sweep; the median sweep at
the full backlog within half the default sweep interval, 2.5 s) are reported, never enforced. ``run(...)``
does the work and returns the results; ``PART.main()`` is the command line; run with ``--child`` it is the child.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_db import database_url, drop_database
from bench_part import REDIS_URL_OPTION, Option, Part, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ROOT,
    BenchError,
    create_migrated_database,
    project_env,
    redis_connection,
    run_command,
)

DEFAULT_OUTPUT = BENCH_DIR / "backlog.json"
PIPELINE = "bench_noop_1"
LOST_ORDINAL = 4  # the fifth oldest task has no job
# Floors (reported): the lost job is delivered again by the first sweep; a median sweep takes at most half
# the default sweep interval (RELIABILITY_SWEEP_INTERVAL_SECONDS = 5), so sweeps keep their pace.
FLOOR_SWEEPS = 1
FLOOR_SWEEP_SECONDS = 2.5

OPTIONS = (
    Option("tasks", type=positive_int, default=100_000, help="queued tasks in the deep backlog"),
    Option("sweeps", type=positive_int, default=10, help="sweeps timed per backlog size"),
    Option("database", default="rc_bench_backlog", help="the backlog part's database"),
    REDIS_URL_OPTION,
)


def run(
    *,
    tasks: int = 100_000,
    sweeps: int = 10,
    database: str = "rc_bench_backlog",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Time ``sweeps`` sweeps with no task and with ``tasks`` queued; write ``output``; return the results."""
    if tasks <= LOST_ORDINAL or sweeps < 1:
        raise BenchError(f"the backlog needs more than {LOST_ORDINAL} tasks and at least one sweep")
    url = database_url(server_url, database)
    env = project_env(url, redis_url)
    connection = redis_connection(redis_url)
    started = time.monotonic()
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        connection.flushdb()
        progress(f"bench: timing {sweeps} sweeps with 0 and with {tasks:,} tasks queued")
        argv = [sys.executable, __file__, "--child", str(tasks), str(sweeps)]
        measured = json.loads(run_command(argv, env, "the backlog child").strip().splitlines()[-1])
    finally:
        # In the background: freeing 100,000 jobs would block the Redis server (other databases too) for a second.
        connection.flushdb(asynchronous=True)
        connection.close()
        if not keep:
            drop_database(server_url, database)

    figures, floors = {}, []
    for size in measured:
        seconds = size["sweep_seconds"]
        size["median_seconds"] = round(statistics.median(seconds), 3)
        size["max_seconds"] = round(max(seconds), 3)
        name = f"backlog.sweep_{size['tasks']}"
        figures[f"{name}.median"] = {"value": size["median_seconds"], "unit": "s"}
        figures[f"{name}.max"] = {"value": size["max_seconds"], "unit": "s"}
        progress(
            f"bench: a sweep with {size['tasks']:,} queued: median {size['median_seconds']} s, "
            f"max {size['max_seconds']} s ({', '.join(f'{value:.2f}' for value in seconds)})"
        )
    deep = measured[-1]
    figures["backlog.lost_job_redelivered_after_sweeps"] = {"value": deep["redelivered_after"], "unit": "sweeps"}
    floors.append(
        {
            "name": f"a job lost among the oldest of {tasks:,} queued is delivered again by sweep {FLOOR_SWEEPS}",
            "value": deep["redelivered_after"],
            "floor": FLOOR_SWEEPS,
            "holds": deep["redelivered_after"] is not None and deep["redelivered_after"] <= FLOOR_SWEEPS,
        }
    )
    floors.append(
        {
            "name": f"median sweep with {tasks:,} queued <= {FLOOR_SWEEP_SECONDS:g} s",
            "value": deep["median_seconds"],
            "floor": FLOOR_SWEEP_SECONDS,
            "holds": deep["median_seconds"] <= FLOOR_SWEEP_SECONDS,
        }
    )
    results = {
        "sizes": measured,
        "figures": figures,
        "floors": floors,
        "sweeps": sweeps,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    header = f"{'queued tasks':>12} {'median s':>9} {'max s':>7}  sweeps s (the first re-delivers the lost job)"
    lines = [
        f"Backlog: one sweep (sweep_once) with no task and with a deep backlog, one job lost among the oldest "
        f"({results['sweeps']} sweeps each, {results['seconds']:.0f} s):",
        header,
        "-" * len(header),
    ]
    for size in results["sizes"]:
        seconds = ", ".join(f"{value:.2f}" for value in size["sweep_seconds"])
        lines.append(f"{size['tasks']:>12,} {size['median_seconds']:>9.3f} {size['max_seconds']:>7.3f}  {seconds}")
    for floor in results["floors"]:
        lines.append(f"floor: {floor['name']}: {floor['value']} ({'holds' if floor['holds'] else 'does NOT hold'})")
    return "\n".join(lines)


def child(tasks: int, sweeps: int) -> list[dict]:
    """In the project's environment: per size, make the backlog and time the sweeps."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django

    django.setup()
    from datetime import timedelta

    from django.conf import settings
    from django.db import connection

    from devtools.backlog import backlog_create
    from tasks.delivery.enqueue import delivery_pending
    from tasks.delivery.sweeper import sweep_once

    measured = []
    age = timedelta(seconds=settings.RELIABILITY_REDELIVERY_GRACE_SECONDS + 1)
    for size in (0, tasks):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE tasks_task CASCADE")
        task_ids = backlog_create(count=size, pipeline=PIPELINE, age=age, lost=[LOST_ORDINAL]) if size else []
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE tasks_task")
        seconds, redelivered_after = [], None
        for sweep in range(1, sweeps + 1):
            started = time.perf_counter()
            sweep_once()
            seconds.append(round(time.perf_counter() - started, 4))
            if task_ids and redelivered_after is None and delivery_pending(task_ids[LOST_ORDINAL], 0):
                redelivered_after = sweep
        measured.append({"tasks": size, "sweep_seconds": seconds, "redelivered_after": redelivered_after})
    return measured


PART = Part(
    name="backlog", run=run, format_table=format_table, options=OPTIONS, default_output=DEFAULT_OUTPUT, doc=__doc__
)

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        sys.exit(0)
    sys.exit(PART.main())
