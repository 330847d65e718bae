"""Processes shared by the benchmark scripts: environment, manage.py commands, workers, gunicorn, submissions.

Every process a benchmark starts runs in its own process group with its output in a log file, and is stopped
by its PID (``ManagedProcesses.stop``), never by a name. Run as a script, this file is the child that submits
tasks through ``task_submit`` with the benchmark's settings (``submit_tasks``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from bench_db import database_url, recreate_database

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
BENCH_DIR = ROOT / "var" / "bench"  # the parts' results files and, beside them, their process logs
# The parts import the project's own process helpers (chaos.processes: gunicorn's command line, a free port).
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432"
# Database 14 of the local Redis is the benchmarks' own: the parts flush it before and after they use it.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
ENGINE_QUEUE = "default"  # the bench pipelines' queue (settings.RELIABILITY_QUEUE)
# With no queue named, a worker listens to every engine queue, highest priority first (critical default bulk).
WORKER_ARGV = [sys.executable, "manage.py", "rqworker"]
WORKER_START_TIMEOUT = 60
SERVER_START_TIMEOUT = 60
# A SIGTERMed worker finishes its job first (warm shutdown): this long, then its group is killed.
STOP_TIMEOUT_SECONDS = 20
# The name is put into DROP DATABASE: a plain identifier only.
DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class BenchError(Exception):
    """The benchmark could not run (a command failed, a worker died, a drain did not finish)."""


BASELINE_VENVS = ROOT / "var" / "bench-venvs"


def baseline_venv(name: str, extra: str, progress: Callable[[str], None] = print) -> Path:
    """The interpreter of a baseline's own venv, ``var/bench-venvs/<name>``, built (or brought in line with
    pyproject) first from pyproject's ``extra``: a peer's dependencies (psycopg 3, SQLAlchemy) would otherwise
    change the project's venv, where psycopg 3 would become Django's driver."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        requirements = tomllib.load(file)["project"]["optional-dependencies"][extra]
    venv = BASELINE_VENVS / name
    python = venv / "bin" / "python"
    wanted = "\n".join(requirements)
    stamp = venv / ".requirements"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    progress(f"bench: building {name}'s venv in {venv}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
    stamp.write_text(wanted)
    return python


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so the ``finally`` blocks that stop child processes run (as on Ctrl-C)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def log_directory(output: Path | None) -> Path:
    """Where a part's process logs go: beside its results file."""
    directory = (output.parent if output else BENCH_DIR).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def redis_connection(redis_url: str):
    from redis import Redis

    return Redis.from_url(redis_url)


def project_env(url: str, redis_url: str, **settings: str) -> dict:
    """The environment of a benchmark's manage.py processes: its database, its Redis, the bench pipelines."""
    return {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": redis_url,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECURE_HTTPS": "0",  # plain HTTP on 127.0.0.1
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "RELIABILITY_ENABLE_BENCH_PIPELINES": "1",
        "PYTHONUNBUFFERED": "1",
        **settings,
    }


def run_command(argv: list[str], env: dict, what: str, *, stream: bool = False, cwd: Path = ROOT) -> str:
    """Run ``argv`` in the project root (or ``cwd``: another tree of the project, ``scripts/bench_compare.py``'s);
    its output (with ``stream``, its output goes to the terminal instead)."""
    stdout = None if stream else subprocess.PIPE
    result = subprocess.run(argv, env=env, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise BenchError(f"{what} failed:\n{result.stderr.strip()[-3000:]}")
    return result.stdout or ""


def manage(env: dict, *args: str, stream: bool = False) -> str:
    return run_command([sys.executable, "manage.py", *args], env, f"manage.py {args[0]}", stream=stream)


def check_database_name(name: str) -> None:
    if not DATABASE_NAME.fullmatch(name):
        raise BenchError(f"database name {name!r}: use letters, digits and underscores only")


def create_migrated_database(server_url: str, name: str, env: dict) -> str:
    """Drop and create the database ``name``, migrate it with ``env`` (whose DATABASE_URL names it); its URL."""
    check_database_name(name)
    url = database_url(server_url, name)
    if env["DATABASE_URL"] != url:
        raise BenchError(f"the environment's DATABASE_URL is not the database {name!r}")
    recreate_database(server_url, name)
    manage(env, "migrate", "--noinput")
    return url


class ManagedProcesses:
    """Processes of one command line in their own process groups, logging to one file; stopped by their PIDs."""

    def __init__(
        self, argv: list[str], count: int, env: dict, log_path: Path, what: str = "a worker", *, cwd: Path = ROOT
    ) -> None:
        self.argv = argv
        self.cwd = cwd  # the tree whose manage.py and packages the processes run (the script's directory first)
        self.env = env
        self.log_path = log_path
        self.what = what
        self.processes: list[subprocess.Popen] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            self.start_one()

    def start_one(self) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, process_group=0
            )
        self.processes.append(process)
        return process

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL one process (the crash a benchmark measures), reap it and forget it."""
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.processes.remove(process)

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise BenchError(f"{self.what} exited with code {process.returncode}; see {self.log_path}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                # The whole group: a forking worker's work horse, gunicorn's workers.
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_registered(connection, queue: str, count: int, workers: ManagedProcesses) -> None:
    key = f"rq:workers:{queue}"
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while connection.scard(key) < count:
        workers.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{count} workers did not register within {WORKER_START_TIMEOUT}s")
        time.sleep(0.05)
    # Registration comes just before the first dequeue: let each reach its blocking BLMOVE.
    time.sleep(0.5)


def start_web_server(argv: list[str], port: int, env: dict, log_path: Path, ready_path: str) -> ManagedProcesses:
    """gunicorn (``argv``, bound to ``port`` on 127.0.0.1), once ``GET ready_path`` answers 200."""
    server = ManagedProcesses(argv, 1, env, log_path, what="gunicorn")
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not _answers(port, ready_path):
            server.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"gunicorn did not answer within {SERVER_START_TIMEOUT}s; see {log_path}")
            time.sleep(0.3)
    except BaseException:
        server.stop()
        raise
    return server


def _answers(port: int, path: str) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


class QueueHold:
    """Keep a queue's jobs away from its workers until ``release()``: the list is renamed away and back."""

    def __init__(self, connection, queue: str) -> None:
        self.connection = connection
        self.key = f"rq:queue:{queue}"
        self.held = f"bench:held:{queue}"

    def hold(self, expected: int) -> None:
        length = self.connection.llen(self.key)
        if length != expected:
            raise BenchError(f"{self.key} holds {length} jobs, expected {expected}")
        self.connection.rename(self.key, self.held)

    def release(self) -> None:
        # RENAME onto a list key wakes the workers blocked in BLMOVE on it.
        self.connection.rename(self.held, self.key)


def submit_tasks(
    env: dict, pipeline: str, count: int, batch: str, *, in_batches: bool = False, root: Path = ROOT
) -> None:
    """Submit ``count`` tasks of ``pipeline`` with input ``{"batch": batch, "n": index}``, in a child process.

    ``in_batches``: through ``task_submit_many``, 1,000 per call (delivered several per job), instead of one
    ``task_submit`` each. ``root``: the tree whose code submits them (its own copy of this script).
    """
    mode = "--submit-batches" if in_batches else "--submit"
    script = root / "scripts" / Path(__file__).name
    run_command(
        [sys.executable, str(script), mode, pipeline, str(count), batch], env, f"submitting {pipeline}", cwd=root
    )


# The tasks ``submit_tasks`` submitted as a batch. With ``since`` (a database time before the batch was submitted)
# they are read through the (pipeline, created_at) index, however many other tasks the table holds (the purge
# part's million, and its earlier drains): reading them all would load the database under measurement.
_BATCH_TASKS = (
    "FROM tasks_task WHERE pipeline = %s AND created_at >= coalesce(%s::timestamptz, '-infinity') "
    "AND input->>'batch' = %s"
)


def count_succeeded(cursor, pipeline: str, batch: str, since=None) -> int:
    """How many of the tasks ``submit_tasks`` submitted as ``batch`` succeeded; a BenchError if any ended otherwise."""
    cursor.execute(
        "SELECT count(*) FILTER (WHERE state = 'succeeded'), "
        "count(*) FILTER (WHERE state NOT IN ('succeeded', 'queued', 'running')) " + _BATCH_TASKS,
        [pipeline, since, batch],
    )
    done, other = cursor.fetchone()
    if other:
        raise BenchError(f"{other} {pipeline} tasks neither succeeded nor running")
    return done


def last_finished(cursor, pipeline: str, batch: str, since=None) -> float:
    """When the last of ``batch``'s tasks finished (epoch seconds), as its worker recorded it (``finished_at``)."""
    cursor.execute("SELECT extract(epoch FROM max(finished_at)) " + _BATCH_TASKS, [pipeline, since, batch])
    (finished,) = cursor.fetchone()
    if finished is None:
        raise BenchError(f"no {pipeline} task of the batch has finished")
    return float(finished)


def submit_child(pipeline: str, count: int, batch: str, *, in_batches: bool = False) -> None:
    """Child mode: submit ``count`` tasks of ``pipeline`` (delivered to Redis after their commit)."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django

    django.setup()
    from tasks import task_submit, task_submit_many

    if in_batches:
        for first in range(0, count, 1000):
            items = [
                {"pipeline": pipeline, "input": {"batch": batch, "n": n}}
                for n in range(first, min(count, first + 1000))
            ]
            refused = [outcome for outcome in task_submit_many(items) if outcome.error is not None]
            if refused:
                sys.exit(f"{len(refused)} items refused: {refused[0].error}")
    else:
        for index in range(count):
            task_submit(pipeline=pipeline, input={"batch": batch, "n": index})
    print(json.dumps({"submitted": count}))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("--submit", "--submit-batches"):
        sys.exit("usage: bench_processes.py --submit|--submit-batches PIPELINE COUNT BATCH")
    submit_child(sys.argv[2], int(sys.argv[3]), sys.argv[4], in_batches=sys.argv[1] == "--submit-batches")
