"""`make bench` (recovery part): from the SIGKILL of a worker in mid-step to the step's next attempt starting elsewhere.

Per lease setting (``default``: the project's own settings, lease 30 s and sweep every 5 s unless the
environment says otherwise; ``short``: lease 3 s, sweep every 0.5 s), against a dedicated migrated database
(``rc_bench_recovery``, dropped at the end unless ``--keep``) and Redis database 14: two ``manage.py rqworker``
processes and one ``manage.py run_sweeper`` run with ``RELIABILITY_LEASE_SECONDS`` and
``RELIABILITY_SWEEP_INTERVAL_SECONDS`` set. Each sample submits one task of the bench-only pipeline
``bench_recovery`` (scripts/bench_recovery_pipeline.py, loaded through this benchmark's environment only),
whose first step hangs on its first attempt and returns at once on the next. Once the step is running (it
wrote its start and PID to Redis, and the task is ``running`` with that worker as ``lease_owner`` in the
database), the worker's process is SIGKILLed; the clock runs until the step's next attempt starts in the other
worker (the time it wrote as its first act). The killed worker is replaced before the next sample.

The kill comes as soon as the step has started, so the lease has just been taken: that is the slow end of the
heartbeat cycle (a kill just before a heartbeat renewal recovers up to a third of a lease sooner). Each sample
starts after a random pause of up to one sweep interval, so the kill falls anywhere in the sweeper's cycle.
The floor, per setting, is the slowest sample <= lease + sweep interval + 2 s: the lease runs out, the next
sweep re-queues the task, a worker claims it.

It is a benchmark, not a test: the floors are reported, never enforced. ``run(...)`` does the work and returns
the results; ``PART.main()`` is the command line.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench_db import connect, database_url, drop_database
from bench_part import REDIS_URL_OPTION, Option, Part, positive_float, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ENGINE_QUEUE,
    SCRIPTS,
    WORKER_ARGV,
    WORKER_START_TIMEOUT,
    BenchError,
    ManagedProcesses,
    create_migrated_database,
    log_directory,
    manage,
    project_env,
    redis_connection,
    submit_tasks,
)

DEFAULT_OUTPUT = BENCH_DIR / "recovery.json"
SETTINGS = ("default", "short")
SHORT_LEASE_SECONDS = 3.0
SHORT_SWEEP_SECONDS = 0.5
# Lease + sweep + this: the time a worker has to claim the re-queued task and start its step.
FLOOR_MARGIN_SECONDS = 2.0
STEP_START_TIMEOUT = 60
# Beyond lease + sweep: a recovery this much slower than its floor is not coming.
RECOVERY_TIMEOUT_MARGIN = 60
POLL_SECONDS = 0.01
WORKERS = 2
PIPELINE_NAME = "bench_recovery"  # scripts/bench_recovery_pipeline.py


OPTIONS = (
    Option("settings", nargs="+", choices=SETTINGS, default=list(SETTINGS), help="lease settings to measure"),
    Option("samples", type=positive_int, default=3, help="kills per setting"),
    Option("short_lease", type=positive_float, default=SHORT_LEASE_SECONDS, help="seconds"),
    Option("short_sweep", type=positive_float, default=SHORT_SWEEP_SECONDS, help="seconds"),
    Option("database", default="rc_bench_recovery", help="the recovery part's database"),
    REDIS_URL_OPTION,
)


def started_key(task_id) -> str:
    """The Redis hash where each attempt of the pipeline's first step records its PID and start time."""
    return f"bench:recovery:{task_id}"


def _effective_settings(env: dict) -> tuple[float, float]:
    """(lease seconds, sweep interval seconds) as the project's settings read them from ``env``."""
    code = (
        "import json; from django.conf import settings; "
        "print(json.dumps([settings.RELIABILITY_LEASE_SECONDS, settings.RELIABILITY_SWEEP_INTERVAL_SECONDS]))"
    )
    lease, sweep = json.loads(manage(env, "shell", "-c", code).strip().splitlines()[-1])
    return float(lease), float(sweep)


def _wait_worker_registered(connection, process, workers: ManagedProcesses) -> None:
    """Until the worker of ``process`` (by PID) is in RQ's registry: a killed worker's entry stays there."""
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while True:
        for key in connection.smembers(f"rq:workers:{ENGINE_QUEUE}"):
            if connection.hget(key, "pid") == str(process.pid).encode():
                # Registration comes just before the first dequeue: let it reach its blocking BLMOVE.
                time.sleep(0.5)
                return
        workers.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"worker {process.pid} did not register within {WORKER_START_TIMEOUT}s")
        time.sleep(0.05)


def _started(connection, task_id: str, attempt: int) -> dict | None:
    value = connection.hget(started_key(task_id), attempt)
    return json.loads(value) if value else None


def _task_row(cursor, task_id: str) -> tuple[str, str]:
    cursor.execute("SELECT state, lease_owner FROM tasks_task WHERE id = %s", [task_id])
    return cursor.fetchone()


def _wait(what: str, timeout: float, found: Callable[[], object], workers: ManagedProcesses, sweeper=None):
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:.0f}s; see {workers.log_path}")
        workers.check_alive()
        if sweeper is not None:
            sweeper.check_alive()
        time.sleep(POLL_SECONDS)


def _sample(url: str, redis, env: dict, workers: ManagedProcesses, sweeper: ManagedProcesses, lease, sweep) -> dict:
    """One kill and recovery: seconds from the SIGKILL to the next attempt's start, and where the time went."""
    # Samples a fixed time apart would meet the sweeper at the same point of its cycle every time: a random
    # pause makes the wait for the next sweep after the lease ran out as likely short as long.
    time.sleep(random.uniform(0, sweep))
    batch = uuid.uuid4().hex
    submit_tasks(env, PIPELINE_NAME, 1, batch)
    database = connect(url)
    try:
        with database.cursor() as cursor:
            cursor.execute("SELECT id::text FROM tasks_task WHERE input->>'batch' = %s", [batch])
            task_id = cursor.fetchone()[0]
            by_pid = {process.pid: process for process in workers.processes}

            def running_on_a_worker():
                first = _started(redis, task_id, 1)
                if first is None or first["pid"] not in by_pid:
                    return None
                state, owner = _task_row(cursor, task_id)
                return first if state == "running" and owner.endswith(f":{first['pid']}") else None

            first = _wait("the step's first attempt to start", STEP_START_TIMEOUT, running_on_a_worker, workers)
            killed_at = time.time()
            workers.kill(by_pid[first["pid"]])
            recovery_timeout = lease + sweep + RECOVERY_TIMEOUT_MARGIN
            second = _wait(
                "the step's next attempt to start",
                recovery_timeout,
                lambda: _started(redis, task_id, 2),
                workers,
                sweeper,
            )
            if second["pid"] == first["pid"] or second["pid"] not in by_pid:
                raise BenchError(f"the next attempt ran in process {second['pid']}, not in the other worker")
            _wait("the task to succeed", 30, lambda: _task_row(cursor, task_id)[0] == "succeeded", workers)
            # The engine's own records of the same recovery: when the sweeper wrote off the lost attempt, and
            # when the runner started the next one (StepAttempt.started_at, taken just before the step runs).
            cursor.execute(
                "SELECT extract(epoch FROM finished_at) FROM tasks_stepattempt "
                "WHERE task_id = %s AND step_index = 0 AND attempt = 1 AND outcome = 'crashed'",
                [task_id],
            )
            (written_off_at,) = cursor.fetchone()
            cursor.execute(
                "SELECT extract(epoch FROM started_at) FROM tasks_stepattempt "
                "WHERE task_id = %s AND step_index = 0 AND attempt = 2",
                [task_id],
            )
            (attempt_started_at,) = cursor.fetchone()
    finally:
        database.close()
    return {
        "seconds": round(second["started_at"] - killed_at, 3),
        "written_off_after": round(float(written_off_at) - killed_at, 3),
        "engine_attempt_started_after": round(float(attempt_started_at) - killed_at, 3),
        "task_id": task_id,
    }


def bench_setting(
    name: str, url: str, redis_url: str, samples: int, lease: float | None, sweep: float | None, log_dir: Path
) -> dict:
    """``samples`` kills and recoveries with 2 workers and a sweeper under one lease setting."""
    overrides = {"PYTHONPATH": str(SCRIPTS), "RELIABILITY_PIPELINE_MODULES": "bench_recovery_pipeline"}
    if lease is not None:
        overrides["RELIABILITY_LEASE_SECONDS"] = str(lease)
    if sweep is not None:
        overrides["RELIABILITY_SWEEP_INTERVAL_SECONDS"] = str(sweep)
    env = project_env(url, redis_url, **overrides)
    lease, sweep = _effective_settings(env)
    redis = redis_connection(redis_url)
    redis.flushdb()
    workers = sweeper = None
    try:
        workers = ManagedProcesses(WORKER_ARGV, WORKERS, env, log_dir / "recovery-workers.log")
        sweeper = ManagedProcesses(
            [sys.executable, "manage.py", "run_sweeper"], 1, env, log_dir / "recovery-sweeper.log", what="the sweeper"
        )
        for process in workers.processes:
            _wait_worker_registered(redis, process, workers)
        results = []
        for _ in range(samples):
            results.append(_sample(url, redis, env, workers, sweeper, lease, sweep))
            _wait_worker_registered(redis, workers.start_one(), workers)
        return {"setting": name, "lease_seconds": lease, "sweep_seconds": sweep, "samples": results}
    finally:
        for processes in (workers, sweeper):
            if processes is not None:
                processes.stop()
        redis.flushdb()
        redis.close()


def floor_name(setting: dict) -> str:
    return (
        f"recovery after SIGKILL ({setting['setting']} lease {setting['lease_seconds']:g} s, "
        f"sweep {setting['sweep_seconds']:g} s) <= {setting['floor']:g} s"
    )


def run(
    *,
    settings: tuple[str, ...] = SETTINGS,
    samples: int = 3,
    short_lease: float = SHORT_LEASE_SECONDS,
    short_sweep: float = SHORT_SWEEP_SECONDS,
    database: str = "rc_bench_recovery",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Measure recovery under each setting; write ``output``; return ``{"settings", "figures", "floors", ...}``."""
    if samples < 1:
        raise BenchError("samples must be a positive integer")
    unknown = set(settings) - set(SETTINGS)
    if unknown or not settings:
        raise BenchError(f"settings: choose from {', '.join(SETTINGS)}")
    log_dir = log_directory(output)
    url = database_url(server_url, database)
    started = time.monotonic()
    measured = []
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, project_env(url, redis_url))
        for name in settings:
            lease, sweep = (short_lease, short_sweep) if name == "short" else (None, None)
            setting = bench_setting(name, url, redis_url, samples, lease, sweep, log_dir)
            seconds = [sample["seconds"] for sample in setting["samples"]]
            setting["median_seconds"] = round(statistics.median(seconds), 2)
            setting["max_seconds"] = round(max(seconds), 2)
            setting["floor"] = round(setting["lease_seconds"] + setting["sweep_seconds"] + FLOOR_MARGIN_SECONDS, 2)
            measured.append(setting)
            progress(
                f"bench: recovery, {name} lease {setting['lease_seconds']:g} s: median {setting['median_seconds']} s, "
                f"max {setting['max_seconds']} s ({', '.join(f'{value:.2f}' for value in seconds)})"
            )
    finally:
        if not keep:
            drop_database(server_url, database)

    figures, floors = {}, []
    for setting in measured:
        figures[f"recovery.{setting['setting']}.median"] = {"value": setting["median_seconds"], "unit": "s"}
        figures[f"recovery.{setting['setting']}.max"] = {"value": setting["max_seconds"], "unit": "s"}
        floors.append(
            {
                "name": floor_name(setting),
                "value": setting["max_seconds"],
                "floor": setting["floor"],
                "holds": setting["max_seconds"] <= setting["floor"],
            }
        )
    results = {
        "settings": measured,
        "figures": figures,
        "floors": floors,
        "samples": samples,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    header = (
        f"{'setting':<9} {'lease s':>7} {'sweep s':>7} {'median s':>9} {'max s':>7} {'floor s':>8} {'holds':<5}  "
        "samples s (lease written off after s)"
    )
    lines = [
        f"Recovery: SIGKILL of a worker in mid-step until the step's next attempt starts in the other worker "
        f"(2 workers + 1 sweeper, {results['samples']} sample(s) per setting, {results['seconds']:.0f} s):",
        header,
        "-" * len(header),
    ]
    for setting in results["settings"]:
        samples = ", ".join(f"{s['seconds']:.2f} ({s['written_off_after']:.2f})" for s in setting["samples"])
        lines.append(
            f"{setting['setting']:<9} {setting['lease_seconds']:>7g} {setting['sweep_seconds']:>7g} "
            f"{setting['median_seconds']:>9.2f} {setting['max_seconds']:>7.2f} {setting['floor']:>8g} "
            f"{'yes' if setting['max_seconds'] <= setting['floor'] else 'NO':<5}  {samples}"
        )
    lines.append("floor: the slowest sample <= lease + sweep interval + 2 s (reported, not enforced)")
    return "\n".join(lines)


PART = Part(
    name="recovery", run=run, format_table=format_table, options=OPTIONS, default_output=DEFAULT_OUTPUT, doc=__doc__
)

if __name__ == "__main__":
    sys.exit(PART.main())
