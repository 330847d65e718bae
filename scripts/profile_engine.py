"""`make profile`: where one worker's time goes while it drains 10-step tasks, and what each task costs the servers.

On the machine's PostgreSQL and Redis (as `make bench`): a dedicated, migrated database; ``--tasks`` tasks of
``bench_noop_10`` (steps that only return) submitted and held back in Redis; one ``manage.py rqworker``
started and registered; then py-spy samples the worker (``py-spy record --format raw``, the collapsed stacks a
flame graph is drawn from) from the moment the queue is released until the last task succeeded. It prints:

- the 10 functions with the most samples on top of the stack (self time) and the 10 with the most samples
  anywhere on it (inclusive time), as shares of all samples, with the worker's steps/s;
- per task, from the servers' own counters: PostgreSQL transactions committed (``pg_stat_database``'s
  ``xact_commit`` of the database), and Redis commands by name (``INFO commandstats`` deltas).

The collapsed stacks are kept in ``var/profile/worker.txt`` (``flamegraph.pl`` or speedscope draw them).
Round trips (as opposed to commands) are counted on the wire by ``tests/acceptance/test_round_trips.py``.
A profile, not a benchmark: it prints shares and counts, and nothing is compared or enforced.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench_db import connect, database_url, drop_database
from bench_processes import (
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ENGINE_QUEUE,
    ROOT,
    WORKER_ARGV,
    BenchError,
    ManagedProcesses,
    QueueHold,
    check_database_name,
    count_succeeded,
    create_migrated_database,
    exit_on_sigterm,
    project_env,
    redis_connection,
    submit_tasks,
    wait_registered,
)

OUTPUT_DIR = ROOT / "var" / "profile"
# The pipelines profiled, by steps per task: 10 shows the step's own cost, 1 what every task costs besides it.
PIPELINES = {10: "bench_noop_10", 1: "bench_noop_1"}
SAMPLE_RATE = 250  # samples per second: py-spy's default is 100
DRAIN_TIMEOUT = 900
TOP = 10


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise BenchError("py-spy is not installed: pip install -e '.[bench]'")
    return found


def _commands(redis) -> collections.Counter:
    stats = redis.info("commandstats")
    return collections.Counter({name.removeprefix("cmdstat_").upper(): value["calls"] for name, value in stats.items()})


def _commits(cursor, database: str) -> int:
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database])
    return cursor.fetchone()[0]


def _stable_commits(cursor, database: str, timeout: float = 10.0) -> int:
    """The database's commit count once the worker's statistics reached the server (they are sent when a
    backend goes idle, at most once a second): the count that stops moving."""
    deadline = time.monotonic() + timeout
    last = _commits(cursor, database)
    while time.monotonic() < deadline:
        time.sleep(1.2)
        now = _commits(cursor, database)
        if now == last:
            return now
        last = now
    return last


def top_frames(stacks: dict[str, int]) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """(self, inclusive) sample counts of the ``TOP`` busiest functions, and all samples, from collapsed stacks.

    Inclusive counts only the engine's own functions (``tasks/``): RQ's and Django's frames around every job
    would fill the list at ~100% and say nothing.
    """
    own: collections.Counter = collections.Counter()
    anywhere: collections.Counter = collections.Counter()
    total = 0
    for stack, count in stacks.items():
        frames = [_function(frame) for frame in stack.split(";") if frame]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            if "(tasks/" in name:
                anywhere[name] += count
    return own.most_common(TOP), anywhere.most_common(TOP), total


def _function(frame: str) -> str:
    """``name (path/to/module.py:123)`` -> ``name (module path)``: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})" if path else name


def _read_stacks(path: Path) -> dict[str, int]:
    stacks: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks to drain (default 2000)")
    parser.add_argument("--steps", type=int, choices=sorted(PIPELINES), default=10, help="steps per task (default 10)")
    parser.add_argument("--server-url", default=DEFAULT_SERVER_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database", default="rc_profile")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    options = parser.parse_args(argv)
    check_database_name(options.database)
    pipeline, steps = PIPELINES[options.steps], options.steps
    py_spy = _py_spy()
    options.output_dir.mkdir(parents=True, exist_ok=True)
    stacks_path = options.output_dir / "worker.txt"
    url = database_url(options.server_url, options.database)
    env = project_env(url, options.redis_url)
    redis = redis_connection(options.redis_url)
    redis.flushdb()
    try:
        create_migrated_database(options.server_url, options.database, env)
        database = connect(database_url(options.server_url, "postgres"))
        watch = connect(url)
        with watch.cursor() as cursor:
            cursor.execute("SELECT now()")
            (since,) = cursor.fetchone()
        batch = uuid.uuid4().hex
        submit_tasks(env, pipeline, options.tasks, batch)
        hold = QueueHold(redis, ENGINE_QUEUE)
        hold.hold(options.tasks)
        workers = ManagedProcesses(WORKER_ARGV, 1, env, options.output_dir / "worker.log")
        try:
            wait_registered(redis, ENGINE_QUEUE, 1, workers)
            (worker,) = workers.processes
            with database.cursor() as cursor:
                commits_before = _stable_commits(cursor, options.database)
            commands_before = _commands(redis)
            spy = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(worker.pid),
                    "--rate",
                    str(SAMPLE_RATE),
                    "--format",
                    "raw",
                    "--output",
                    str(stacks_path),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            time.sleep(1.0)  # py-spy attaches before the first job is taken
            started = time.perf_counter()
            hold.release()
            deadline = time.monotonic() + DRAIN_TIMEOUT
            polls = 1  # each poll is a transaction of the database too: taken off the worker's count below
            with watch.cursor() as cursor:
                while count_succeeded(cursor, pipeline, batch, since) < options.tasks:
                    polls += 1
                    if time.monotonic() > deadline:
                        raise BenchError(f"not drained after {DRAIN_TIMEOUT} s; see {workers.log_path}")
                    workers.check_alive()
                    time.sleep(0.02)
            seconds = time.perf_counter() - started
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
            commands = _commands(redis) - commands_before
            with database.cursor() as cursor:
                commits = _stable_commits(cursor, options.database) - commits_before - polls
        finally:
            workers.stop()
        watch.close()
        database.close()
    finally:
        redis.flushdb()
        redis.close()
        if not options.keep:
            drop_database(options.server_url, options.database)

    own, anywhere, total = top_frames(_read_stacks(stacks_path))
    tasks = options.tasks
    print(
        f"profile: 1 worker drained {tasks:,} {pipeline} tasks in {seconds:.1f} s "
        f"({tasks * steps / seconds:,.0f} steps/s under py-spy at {SAMPLE_RATE} Hz), {total:,} samples"
    )
    for title, rows in (
        ("self (on top of the stack)", own),
        ("of the engine, inclusive (anywhere on the stack)", anywhere),
    ):
        print(f"\ntop {TOP} functions, {title}:")
        for name, count in rows:
            print(f"  {100 * count / total:5.1f}%  {name}")
    print(f"\nper task ({steps} steps), from the servers' counters: {commits / tasks:.2f} PostgreSQL commits")
    print("Redis commands per task:")
    for name, count in sorted(commands.items(), key=lambda item: -item[1]):
        if count / tasks >= 0.05:
            print(f"  {count / tasks:6.2f}  {name}")
    print(f"\ncollapsed stacks: {stacks_path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        sys.exit(f"profile: {exc}")
