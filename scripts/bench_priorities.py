"""`make bench` (priorities part): how long a critical task waits behind 5,000 queued bulk tasks and 2 workers.

Against a dedicated migrated database (``rc_bench_priorities``, dropped at the end unless ``--keep``) and Redis
database 14 (flushed before and after), a child process with the project's settings makes ``--tasks`` QUEUED
``bench_bulk`` tasks (queue ``bulk``, one step of 50 ms) with their jobs waiting (``devtools.backlog``), starts
``--workers`` ``manage.py rqworker`` processes (no queue named: every queue, highest priority first), lets them
warm up on the backlog, then submits ``--critical`` ``bench_critical`` tasks (queue ``critical``, a no-op step)
one after another, each once the one before has started, at a random moment of the bulk jobs' cycle. A critical
task's wait is from its submission (``created_at``) to its step's start (the attempt's ``started_at``); its wait
once accepted starts when ``task_submit`` returned instead (the row committed and the job in Redis, as when the
API has answered), leaving out the submission's own work, which no bulk task delays.

The baseline, measured in the same run: one bulk task's run time as its worker lives it, the median interval between two
consecutive bulk step starts of one worker (claim, step, checkpoint, RQ's own work). With strict priorities a critical
task waits for the first worker to finish its current bulk task: about one run time at most (the bulk task in flight may
run a little longer than the median). The exact form of that promise is the floor: no worker takes a bulk job off its
queue between a critical task's acceptance and the moment a worker takes the critical one (read from the workers' log:
RQ logs each job as it dequeues it, to the millisecond; a worker the OS holds up between its pop and that line can show
a job taken before the critical one as taken after it, so a rare 1 with a late offset is that, not a worker passing over
the critical queue: BLPOP takes the first of its keys that holds a job). It is a benchmark, not a test: the floor is
reported, never enforced. ``run(...)`` does the work and returns the results; ``PART.main()`` is the command line; run
with ``--child`` it is the child.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from bench_db import database_url, drop_database
from bench_part import REDIS_URL_OPTION, Option, Part, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ROOT,
    WORKER_ARGV,
    BenchError,
    ManagedProcesses,
    create_migrated_database,
    project_env,
    redis_connection,
    run_command,
    wait_registered,
)

DEFAULT_OUTPUT = BENCH_DIR / "priorities.json"
BULK_PIPELINE = "bench_bulk"
CRITICAL_PIPELINE = "bench_critical"
# Bulk tasks every worker finishes before the first critical submission (imports, connections, caches warm).
WARM_UP_PER_WORKER = 20
CRITICAL_START_TIMEOUT = 60

OPTIONS = (
    Option("tasks", type=positive_int, default=5000, help="bulk tasks queued before the workers start"),
    Option("critical", type=positive_int, default=20, help="critical tasks submitted one after another"),
    Option("workers", type=positive_int, default=2, help="worker processes"),
    Option("database", default="rc_bench_priorities", help="the priorities part's database"),
    REDIS_URL_OPTION,
)


def run(
    *,
    tasks: int = 5000,
    critical: int = 20,
    workers: int = 2,
    database: str = "rc_bench_priorities",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Measure ``critical`` critical tasks' waits behind ``tasks`` bulk tasks and ``workers`` workers."""
    if tasks < workers * WARM_UP_PER_WORKER * 2:
        raise BenchError(f"the backlog needs at least {workers * WARM_UP_PER_WORKER * 2} bulk tasks")
    url = database_url(server_url, database)
    env = project_env(url, redis_url)
    connection = redis_connection(redis_url)
    started = time.monotonic()
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        connection.flushdb()
        progress(f"bench: {critical} critical tasks behind {tasks:,} bulk tasks with {workers} workers")
        log_path = (output.parent if output else BENCH_DIR) / "priorities-workers.log"
        argv = [sys.executable, __file__, "--child", str(tasks), str(critical), str(workers), str(log_path)]
        measured = json.loads(run_command(argv, env, "the priorities child").strip().splitlines()[-1])
    finally:
        connection.flushdb(asynchronous=True)
        connection.close()
        if not keep:
            drop_database(server_url, database)

    waits, accepted = measured["waits"], measured["waits_accepted"]
    bulk_run = measured["bulk_run_seconds"]
    median_wait, max_wait = statistics.median(waits), max(waits)
    max_accepted = max(accepted)
    figures = {
        "priorities.critical_wait.median": {"value": round(median_wait, 4), "unit": "s"},
        "priorities.critical_wait.max": {"value": round(max_wait, 4), "unit": "s"},
        "priorities.critical_wait_accepted.median": {"value": round(statistics.median(accepted), 4), "unit": "s"},
        "priorities.critical_wait_accepted.max": {"value": round(max_accepted, 4), "unit": "s"},
        "priorities.submission.median": {"value": round(statistics.median(measured["submissions"]), 4), "unit": "s"},
        "priorities.bulk_task_run.median": {"value": round(bulk_run, 4), "unit": "s"},
        "priorities.critical_wait.max_ratio": {"value": round(max_wait / bulk_run, 2), "unit": "x"},
        "priorities.critical_wait_accepted.max_ratio": {"value": round(max_accepted / bulk_run, 2), "unit": "x"},
    }
    overtaken = max(len(taken) for taken in measured["bulk_taken_while_waiting"])
    figures["priorities.bulk_taken_while_a_critical_waited.max"] = {"value": overtaken, "unit": "jobs"}
    floors = [
        {
            "name": f"behind {tasks:,} bulk tasks no worker takes a bulk job while a critical one waits (most bulk "
            f"jobs dequeued between a critical task's acceptance and its dequeue)",
            "value": overtaken,
            "floor": 0,
            "holds": overtaken == 0,
        }
    ]
    results = {
        **measured,
        "tasks": tasks,
        "workers": workers,
        "figures": figures,
        "floors": floors,
        "seconds": round(time.monotonic() - started, 1),
    }
    progress(
        f"bench: critical wait: median {median_wait:.3f} s, max {max_wait:.3f} s; once accepted max "
        f"{max_accepted:.3f} s = {max_accepted / bulk_run:.2f}x one bulk task's run time ({bulk_run:.3f} s)"
    )
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    waits, accepted = results["waits"], results["waits_accepted"]
    bulk_run = results["bulk_run_seconds"]
    median_wait, max_wait = statistics.median(waits), max(waits)
    lines = [
        f"Priorities: {len(waits)} critical tasks submitted one after another behind {results['tasks']:,} queued "
        f"bulk tasks, {results['workers']} workers ({results['seconds']:.0f} s):",
        f"one bulk task's run time (baseline, median per worker): {bulk_run:.3f} s",
        f"critical wait (submission -> step start): median {median_wait:.3f} s = {median_wait / bulk_run:.2f}x, "
        f"max {max_wait:.3f} s = {max_wait / bulk_run:.2f}x one bulk task's run time",
        f"critical wait once accepted (submit returned -> step start): median {statistics.median(accepted):.3f} s = "
        f"{statistics.median(accepted) / bulk_run:.2f}x, max {max(accepted):.3f} s = {max(accepted) / bulk_run:.2f}x "
        f"(the submission itself: median {statistics.median(results['submissions']):.3f} s)",
        f"bulk jobs any worker took while a critical one waited (accepted -> dequeued): at most "
        f"{max(len(taken) for taken in results['bulk_taken_while_waiting'])} (logged ms after the acceptance: "
        f"{sorted(at for taken in results['bulk_taken_while_waiting'] for at in taken) or 'none'})",
        f"bulk jobs still waiting at the submissions: {min(results['bulk_depths']):,} to "
        f"{max(results['bulk_depths']):,}",
    ]
    for floor in results["floors"]:
        lines.append(f"floor: {floor['name']}: {floor['value']} ({'holds' if floor['holds'] else 'does NOT hold'})")
    return "\n".join(lines)


def child(tasks: int, critical: int, workers: int, log_path: Path) -> dict:
    """In the project's environment: the backlog, the workers, the critical submissions and what they waited."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django

    django.setup()
    from datetime import timedelta

    from django.utils import timezone

    from devtools.backlog import backlog_create
    from tasks.bench_pipelines import BENCH_BULK_STEP_SECONDS
    from tasks.delivery.enqueue import get_queue, redis_client
    from tasks.models import StepAttempt, Task
    from tasks.submission.submit import task_submit

    backlog_create(count=tasks, pipeline=BULK_PIPELINE, age=timedelta(0))
    bulk_queue = get_queue("bulk")
    # The log is appended to by every run: this run's dequeues start here.
    log_start = log_path.stat().st_size if log_path.exists() else 0
    pool = ManagedProcesses(WORKER_ARGV, workers, dict(os.environ), log_path)
    rng = random.Random(14)
    waits, accepted, submissions, depths, windows = [], [], [], [], []
    try:
        wait_registered(redis_client(), "critical", workers, pool)
        warm = workers * WARM_UP_PER_WORKER
        while Task.objects.filter(pipeline=BULK_PIPELINE, state="succeeded").count() < warm:
            pool.check_alive()
            time.sleep(0.05)
        for ordinal in range(critical):
            # Land anywhere in the bulk jobs' cycle, not always just after a worker picked one up.
            time.sleep(rng.uniform(0, 2 * BENCH_BULK_STEP_SECONDS))
            depths.append(bulk_queue.count)
            task = task_submit(pipeline=CRITICAL_PIPELINE, input={"ordinal": ordinal})
            accepted_at = timezone.now()
            deadline = time.monotonic() + CRITICAL_START_TIMEOUT
            while (attempt := StepAttempt.objects.filter(task=task).first()) is None:
                pool.check_alive()
                if time.monotonic() > deadline:
                    raise BenchError(f"critical task {task.pk} did not start within {CRITICAL_START_TIMEOUT}s")
                time.sleep(0.002)
            waits.append((attempt.started_at - task.created_at).total_seconds())
            accepted.append((attempt.started_at - accepted_at).total_seconds())
            submissions.append((accepted_at - task.created_at).total_seconds())
            windows.append((accepted_at, str(task.pk)))
        if min(depths) == 0:
            raise BenchError("the bulk backlog drained before the last critical task: raise --priorities-tasks")
    finally:
        pool.stop()
    return {
        "waits": waits,
        "waits_accepted": accepted,
        "submissions": submissions,
        "bulk_depths": depths,
        "bulk_run_seconds": _bulk_run_seconds(StepAttempt),
        "bulk_taken_while_waiting": _taken_while_waiting(windows, log_path, log_start),
    }


# RQ's line for a job it has just dequeued, "<asctime> INFO rq.worker Worker <name>: <queue>: <description> (<id>)"
# (not its "<queue>: Job OK (<id>)" when the job is done).
_DEQUEUED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO rq\.worker Worker \S+: (\w+): tasks\.jobs\.run_task\("
    r"'([0-9a-f-]{36})'\)"
)


def _taken_while_waiting(windows: list[tuple[datetime, str]], log_path: Path, log_start: int) -> list[list[float]]:
    """For each (acceptance, critical task id): when (ms after the acceptance) the workers dequeued a bulk job
    after it and before that task."""
    bulk, critical = [], {}
    with open(log_path, "rb") as log:
        log.seek(log_start)
        lines = log.read().decode(errors="replace").splitlines()
    for line in lines:
        if match := _DEQUEUED.match(line):
            # The log's times are local and to the millisecond.
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
            if match[2] == "bulk":
                bulk.append(at)
            elif match[2] == "critical":
                critical[match[3]] = at
    missing = [task_id for _, task_id in windows if task_id not in critical]
    if missing:
        raise BenchError(f"the workers' log does not show critical task {missing[0]} dequeued")
    taken = []
    for accepted_at, task_id in windows:
        # A job logged in the acceptance's own millisecond may have been taken before it: not counted.
        after = accepted_at.replace(microsecond=accepted_at.microsecond // 1000 * 1000)
        taken.append(
            [round((at - accepted_at).total_seconds() * 1000, 1) for at in bulk if after < at < critical[task_id]]
        )
    return taken


def _bulk_run_seconds(step_attempts) -> float:
    """The median interval between consecutive bulk step starts of one worker, over intervals without a critical."""
    starts = defaultdict(list)
    for worker, pipeline, started_at in step_attempts.objects.filter(
        task__pipeline__in=(BULK_PIPELINE, CRITICAL_PIPELINE)
    ).values_list("worker", "task__pipeline", "started_at"):
        starts[worker].append((started_at, pipeline))
    intervals = []
    for runs in starts.values():
        runs.sort()
        for (before, first), (after, second) in itertools.pairwise(runs):
            if first == second == BULK_PIPELINE:
                intervals.append((after - before).total_seconds())
    if not intervals:
        raise BenchError("no two consecutive bulk tasks on one worker: nothing to compare with")
    return statistics.median(intervals)


PART = Part(
    name="priorities", run=run, format_table=format_table, options=OPTIONS, default_output=DEFAULT_OUTPUT, doc=__doc__
)

if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        outcome = child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
        print(json.dumps(outcome))
        sys.exit(0)
    sys.exit(PART.main())
