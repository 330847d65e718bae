"""What one worker job costs in CPU instructions, counted by valgrind (deterministic, unlike seconds here).

Timings on this machine move by 10 % and more between two runs of the same code (a virtual machine of 2
cores), more than most changes to the hot path save. ``valgrind --tool=callgrind`` counts the instructions a
process executes instead: the same code, data and environment give the same count within about 0.5 %, whatever
else the machine does. So a change to a worker's per-job work is measured here, and its seconds by ``make bench``.

On the machine's PostgreSQL and Redis (as ``make bench``): a dedicated, migrated database; ``--tasks`` tasks of
``bench_noop_<steps>`` submitted by another process; then ``manage.py rqworker --burst`` drains them under
callgrind. The same worker with nothing to do is counted first, and the difference divided by the tasks is one
job's count: its dequeue, RQ's bookkeeping, the claim and the steps, in the worker process only (PostgreSQL's
and Redis's own work is not counted). Python files are compiled before either run, so neither pays for that.

Run: ``.venv/bin/python scripts/count_instructions.py [--steps 10] [--tasks 60] [--batch]`` (about a minute and
a half for the defaults; valgrind runs the worker about 50 times slower). ``--batch`` submits them with
``task_submit_many`` (delivered several per job, as ``make bench``'s batch figure) and gives a task's share.
Run from another tree of the project (``var/bench/trees/<commit>/``, made by ``scripts/bench_compare.py``), it
counts that commit's code: a change's cost in instructions, before and after.
"""

from __future__ import annotations

import argparse
import compileall
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench_db import database_url, drop_database
from bench_processes import (
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ROOT,
    WORKER_ARGV,
    BenchError,
    check_database_name,
    create_migrated_database,
    exit_on_sigterm,
    project_env,
    redis_connection,
    submit_tasks,
)

PIPELINES = {1: "bench_noop_1", 10: "bench_noop_10"}
TOTAL = re.compile(r"^totals: (\d+)", re.MULTILINE)


def count(env: dict, out_dir: Path, label: str) -> int:
    """Instructions ``manage.py rqworker --burst`` executes with ``env``, until its queues are empty."""
    out = out_dir / f"callgrind.{label}"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *WORKER_ARGV, "--burst"]
    result = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise BenchError(f"the worker under valgrind failed:\n{result.stderr[-3000:]}")
    found = TOTAL.search(out.read_text(errors="replace"))
    if found is None:
        raise BenchError(f"no instruction total in {out}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()  # a SIGTERM still drops the database and empties Redis (the finally below)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, choices=sorted(PIPELINES), default=10, help="steps per task (default 10)")
    parser.add_argument("--tasks", type=int, default=60, help="tasks drained (default 60)")
    parser.add_argument(
        "--batch",
        action="store_true",
        help="submit them with task_submit_many (several per job, as make bench's batch figure): a task's share",
    )
    parser.add_argument("--server-url", default=DEFAULT_SERVER_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database", default="rc_instructions")
    options = parser.parse_args(argv)
    check_database_name(options.database)  # before the clean-up below ever drops it
    if shutil.which("valgrind") is None:
        raise BenchError("valgrind is not installed (Debian package valgrind)")
    if options.tasks < 1:
        parser.error("--tasks must be at least 1")
    url = database_url(options.server_url, options.database)
    env = {**project_env(url, options.redis_url), "RELIABILITY_LOG_LEVEL": "INFO"}
    redis = redis_connection(options.redis_url)
    redis.flushdb()
    try:
        create_migrated_database(options.server_url, options.database, env)
        for package in ("tasks", "reliability_console", "dlq"):
            compileall.compile_dir(str(ROOT / package), quiet=1)
        with tempfile.TemporaryDirectory(prefix="rc-instructions-") as directory:
            empty = count(env, Path(directory), "empty")
            submit_tasks(env, PIPELINES[options.steps], options.tasks, uuid.uuid4().hex, in_batches=options.batch)
            drained = count(env, Path(directory), "drained")
        if redis.llen("rq:queue:default"):
            raise BenchError("the worker left jobs in the queue")
    finally:
        redis.flushdb()
        redis.close()
        drop_database(options.server_url, options.database)
    per_job = (drained - empty) / options.tasks
    what = "task, batch-submitted" if options.batch else "task's job"
    print(
        f"instructions: {per_job / 1e6:.2f} M per {options.steps}-step {what} ({options.tasks} tasks; the worker "
        f"with nothing to do {empty / 1e6:,.1f} M, with them {drained / 1e6:,.1f} M)"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        sys.exit(f"count_instructions: {exc}")
