"""`make bench` (purge part): the retention purge of 1,000,000 finished tasks while 2 workers run 10-step tasks.

Against a dedicated migrated database (``rc_bench_purge``, dropped at the end unless ``--keep``) and Redis
database 14, with ``RELIABILITY_ENABLE_BENCH_PIPELINES=1``:

1. ``manage.py seed_finished_tasks`` adds ``--tasks`` tasks that finished 60 to 90 days ago, each with the rows
   a 4-step run leaves (4 attempts, 4 checkpoints, 4 ledger rows; one in 25 with a resolved dead letter), by
   set-based SQL, then VACUUM (ANALYZE): the seeding time is a figure.
2. Without the purge: ``--drains`` drains of ``--ten-step-tasks`` ``bench_noop_10`` tasks by 2
   ``manage.py rqworker`` processes, each timed as the engine part times its drains (submitted and held back,
   workers started and registered, released, clock stopped when the last one succeeded): tasks/s.
3. With the purge: ``manage.py purge_finished_tasks --older-than 30`` in its own process (the service the
   sweeper runs, here to the end, at the default batch size) and, while it runs, drains of the same size one
   after the other. A drain counts if the purge was still running when it ended.
4. The purge's rate (tasks/s and rows/s over its whole run, from the run's own record, ``RetentionPurge``) and the
   workers' throughput during it as a ratio of their throughput without it (floor 0.7). Every seeded task must
   be gone at the end.

The drains' steps/s are ten times their tasks/s. It is a benchmark, not a test: the floor is reported (holds
yes/no), never enforced. ``run(...)`` does the work and returns the results; ``PART.main()`` is the command line.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_db import connect, database_url, drop_database
from bench_engine import bench_engine
from bench_part import REDIS_URL_OPTION, Option, Part, non_negative_float, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    BenchError,
    ManagedProcesses,
    check_database_name,
    create_migrated_database,
    log_directory,
    manage,
    project_env,
)

DEFAULT_OUTPUT = BENCH_DIR / "purge.json"
PIPELINE = "bench_noop_10"
WORKERS = 2
RETENTION_DAYS = 30  # RELIABILITY_TASK_RETENTION_DAYS' default; the seeded tasks are all older
SEEDED_AGE_DAYS = 60
PURGE_TIMEOUT = 3600
FLOOR_RATIO = 0.7
FLOOR = f"purge: 10-step throughput of 2 workers during the purge >= {FLOOR_RATIO:.0%} of without"

OPTIONS = (
    Option("tasks", type=positive_int, default=1_000_000, help="old finished tasks to seed and purge"),
    Option("steps", type=positive_int, default=4, help="steps of each seeded task (its attempts, checkpoints, ...)"),
    Option("ten_step_tasks", type=positive_int, default=1000, help="bench_noop_10 tasks per drain"),
    Option("drains", type=positive_int, default=3, help="drains without the purge (the baseline)"),
    Option(
        "pause_ratio",
        type=non_negative_float,
        default=None,
        help="the purge's --pause-ratio (default: RELIABILITY_PURGE_PAUSE_RATIO's default, as the sweeper)",
    ),
    Option("database", default="rc_bench_purge", help="the purge part's database"),
    REDIS_URL_OPTION,
)


def _purge_record(url: str) -> tuple[int, int, float]:
    """(tasks, rows, seconds) of the purge run the command made, as it recorded itself."""
    database = connect(url)
    try:
        with database.cursor() as cursor:
            cursor.execute(
                "SELECT last_items, last_rows, last_seconds FROM tasks_retentionpurge WHERE kind = 'finished_tasks'"
            )
            row = cursor.fetchone()
            cursor.execute(
                "SELECT count(*) FROM tasks_task WHERE finished_at < now() - %s * interval '1 day'", [RETENTION_DAYS]
            )
            (left,) = cursor.fetchone()
    finally:
        database.close()
    if row is None:
        raise BenchError("the purge recorded no run")
    if left:
        raise BenchError(f"{left:,} tasks past the retention are left after the purge")
    return row


def _table_rows(url: str) -> int:
    database = connect(url)
    try:
        with database.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT count(*) FROM tasks_task) + (SELECT count(*) FROM tasks_stepattempt) "
                "+ (SELECT count(*) FROM tasks_checkpoint) + (SELECT count(*) FROM tasks_sideeffect) "
                "+ (SELECT count(*) FROM dlq_dlqitem)"
            )
            return cursor.fetchone()[0]
    finally:
        database.close()


def run(
    *,
    tasks: int = 1_000_000,
    steps: int = 4,
    ten_step_tasks: int = 1000,
    drains: int = 3,
    pause_ratio: float | None = None,
    database: str = "rc_bench_purge",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Seed, measure the workers without and with the purge; write ``output``; return the results."""
    check_database_name(database)
    log_dir = log_directory(output)
    url = database_url(server_url, database)
    env = project_env(url, redis_url)
    started = time.monotonic()
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        progress(f"bench: seeding {tasks:,} finished tasks of {steps} steps")
        seed_started = time.monotonic()
        seed = ("--tasks", str(tasks), "--steps", str(steps), "--age-days", str(SEEDED_AGE_DAYS))
        manage(env, "seed_finished_tasks", *seed)
        seed_seconds = time.monotonic() - seed_started
        seeded_rows = _table_rows(url)
        progress(f"bench: seeded {seeded_rows:,} rows in {seed_seconds:.0f}s")

        without = []
        for index in range(drains):
            without.append(bench_engine(url, redis_url, PIPELINE, WORKERS, ten_step_tasks, log_dir))
            progress(f"bench: drain {index + 1} without the purge: {without[-1]:,.1f} tasks/s")

        argv = [sys.executable, "manage.py", "purge_finished_tasks", "--older-than", str(RETENTION_DAYS)]
        if pause_ratio is not None:
            argv += ["--pause-ratio", str(pause_ratio)]
        purge = ManagedProcesses(
            argv,
            1,
            env,
            log_dir / "purge.log",
            what="the purge",
        )
        process = purge.processes[0]
        purge_started = time.monotonic()
        during: list[float] = []
        try:
            while process.poll() is None:
                rate = bench_engine(url, redis_url, PIPELINE, WORKERS, ten_step_tasks, log_dir)
                if process.poll() is not None:
                    progress(f"bench: drain during the purge ended after it ({rate:,.1f} tasks/s): not counted")
                    break
                during.append(rate)
                progress(f"bench: drain {len(during)} during the purge: {rate:,.1f} tasks/s")
            process.wait(timeout=PURGE_TIMEOUT)
            purge_wall_seconds = time.monotonic() - purge_started
        finally:
            purge.stop()
        if process.returncode != 0:
            raise BenchError(f"the purge exited with code {process.returncode}; see {purge.log_path}")
        purged_tasks, purged_rows, purge_seconds = _purge_record(url)
        progress(f"bench: purged {purged_tasks:,} tasks ({purged_rows:,} rows) in {purge_seconds:.0f}s")
    finally:
        if not keep:
            drop_database(server_url, database)

    if purged_tasks != tasks:
        raise BenchError(f"the purge deleted {purged_tasks:,} tasks, not the {tasks:,} seeded")
    baseline = statistics.mean(without)
    ratio = statistics.mean(during) / baseline if during else None
    figures = {
        "purge.seed_seconds": {"value": round(seed_seconds, 1), "unit": "s"},
        "purge.seeded_rows": {"value": seeded_rows, "unit": "rows"},
        "purge.purge_seconds": {"value": round(purge_seconds, 1), "unit": "s"},
        "purge.purge_tasks_per_second": {"value": round(purged_tasks / purge_seconds, 1), "unit": "tasks/s"},
        "purge.purge_rows_per_second": {"value": round(purged_rows / purge_seconds, 1), "unit": "rows/s"},
        "purge.engine_10step_2w_without_purge": {"value": round(baseline * 10, 1), "unit": "steps/s"},
    }
    if during:
        figures["purge.engine_10step_2w_during_purge"] = {
            "value": round(statistics.mean(during) * 10, 1),
            "unit": "steps/s",
        }
        figures["purge.throughput_ratio"] = {"value": round(ratio, 3), "unit": "ratio"}
    floors = [
        {
            "name": FLOOR,
            "value": None if ratio is None else round(ratio, 3),
            "floor": FLOOR_RATIO,
            "holds": ratio is not None and ratio >= FLOOR_RATIO,
        }
    ]
    results = {
        "figures": figures,
        "floors": floors,
        "drains": {"without": [round(r, 1) for r in without], "during": [round(r, 1) for r in during]},
        "purge": {
            "tasks": purged_tasks,
            "rows": purged_rows,
            "seconds": round(purge_seconds, 1),
            "wall_seconds": round(purge_wall_seconds, 1),
        },
        "sizes": {"tasks": tasks, "steps": steps, "ten_step_tasks": ten_step_tasks, "drains": drains},
        "pause_ratio": pause_ratio,
        "seconds": round(time.monotonic() - started, 1),
        "environment": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    figures, sizes, purge = results["figures"], results["sizes"], results["purge"]
    drains = results["drains"]
    lines = [
        f"Retention purge ({sizes['tasks']:,} finished {sizes['steps']}-step tasks, "
        f"{figures['purge.seeded_rows']['value']:,} rows; "
        f"drains of {sizes['ten_step_tasks']:,} 10-step tasks by 2 workers; "
        f"{results['environment']['cpus']} CPUs, {results['seconds']:.0f} s):",
        "",
        f"  seeding (set-based SQL + VACUUM ANALYZE)  {figures['purge.seed_seconds']['value']:>10,.1f} s",
        f"  purge                                     {purge['seconds']:>10,.1f} s "
        f"({purge['tasks']:,} tasks, {purge['rows']:,} rows)",
        f"  purge rate                                {figures['purge.purge_tasks_per_second']['value']:>10,.1f} "
        f"tasks/s, {figures['purge.purge_rows_per_second']['value']:,.1f} rows/s",
        f"  10-step, 2 workers, without the purge     "
        f"{figures['purge.engine_10step_2w_without_purge']['value']:>10,.1f} steps/s "
        f"(drains: {', '.join(f'{rate * 10:,.0f}' for rate in drains['without'])})",
    ]
    if "purge.throughput_ratio" in figures:
        lines.append(
            f"  10-step, 2 workers, during the purge      "
            f"{figures['purge.engine_10step_2w_during_purge']['value']:>10,.1f} steps/s "
            f"(drains: {', '.join(f'{rate * 10:,.0f}' for rate in drains['during'])})"
        )
        lines.append(f"  ratio                                     {figures['purge.throughput_ratio']['value']:>10.3f}")
    else:
        lines.append("  during the purge: no drain ended before the purge did (seed more tasks)")
    lines += ["", "floors (reported, not enforced):"]
    for floor in results["floors"]:
        value = "not measured" if floor["value"] is None else f"{floor['value']:.3f}"
        lines.append(f"  {floor['name']}: {value} vs {floor['floor']} -> holds {'yes' if floor['holds'] else 'NO'}")
    return "\n".join(lines)


PART = Part(
    name="purge",
    run=run,
    format_table=format_table,
    options=OPTIONS,
    default_output=DEFAULT_OUTPUT,
    doc=__doc__,
)

if __name__ == "__main__":
    sys.exit(PART.main())
