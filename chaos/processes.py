"""The processes a campaign starts: a private redis-server, manage.py commands, gunicorn, a worker pool.

Each child runs in its own process group with its output in a log file of the run's directory, so a
campaign can kill, stop and continue one process without touching anything it did not start.
"""

from __future__ import annotations

import itertools
import os
import signal as signals
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reliability_console.local_redis import redis_server_argv

ROOT = Path(__file__).resolve().parent.parent


# How long a process may take to stop after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 15.0


class DeploymentError(RuntimeError):
    """A part of the deployment did not start or answer in time."""


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (each socket stays bound until all are picked, so none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise DeploymentError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(interval)


def worker_pid(identity: str) -> int | None:
    """The process id at the end of a worker identity (a lease owner, ``tasks.delivery.jobs.worker_identity``), else
    None."""
    try:
        return int(identity.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def manage_argv(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


class Child:
    """One child process with its log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        unique_log: bool = False,
        user: str | None = None,
    ) -> None:
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        # Unique names when many runs share one log folder (the test suite's).
        suffix = f"-{os.getpid()}-{time.monotonic_ns()}" if unique_log else ""
        self.log_path = log_dir / f"{name}{suffix}.log"
        self._log = open(self.log_path, "ab")
        self._terminated = False
        # ``user``: run as that system user (and its group only), for servers that refuse to run as root.
        as_user = {"user": user, "group": user, "extra_groups": []} if user else {}
        self.process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, process_group=0, **as_user
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.process.pid, sig)

    def kill(self, sig: int = signals.SIGKILL) -> None:
        self.signal(sig)

    def terminate(self) -> None:
        """Ask the process to stop (SIGTERM), once; ``stop()`` waits for it."""
        if self.alive() and not self._terminated:
            self._terminated = True
            # A stopped process cannot act on SIGTERM until it is continued.
            self.signal(signals.SIGCONT)
            self.process.terminate()

    def stop(self, timeout: float = STOP_GRACE_SECONDS) -> None:
        if self.alive():
            self.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        else:
            self.process.wait()
        self._log.close()

    def tail(self, chars: int | None = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return text if chars is None else text[-chars:]

    def output(self) -> str:
        return self.tail(None)


class PrivateRedis:
    """A redis-server of the campaign's own, on a free port, that can be restarted and flushed."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.directory = log_dir / "redis"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.child: Child | None = None
        self._starts = itertools.count(1)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def env(self) -> dict[str, str]:
        """The settings that point a process of the deployment at this Redis (and at no Sentinel)."""
        return {"REDIS_URL": self.url, "REDIS_SENTINELS": "", "REDIS_SENTINEL_MASTER": ""}

    def describe(self) -> str:
        return f"redis-server on port {self.port}"

    def start(self) -> None:
        argv = redis_server_argv(self.port, str(self.directory))
        self.child = Child(f"redis-{next(self._starts)}", argv, dict(os.environ), self.log_dir)
        wait_until(self.ping, 15, f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def command(self, *words: str) -> bytes:
        payload = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(payload.encode())
            return sock.recv(64)

    def ping(self) -> bool:
        try:
            return self.command("PING").startswith(b"+PONG")
        except OSError:
            return False

    def flushall(self) -> None:
        if not self.command("FLUSHALL").startswith(b"+OK"):
            raise DeploymentError("redis FLUSHALL was refused")


# What RQ logs when a worker's loop starts taking jobs.
LISTENING = "*** Listening on"
# The engine's queues, highest priority first (settings.RELIABILITY_QUEUES; a unit test keeps them equal).
# Named on the command line, as a deployment's unit files name them.
WORKER_QUEUES = ("critical", "default", "bulk")


def worker_argv() -> list[str]:
    """A worker (and RQ scheduler) of every engine queue, in priority order."""
    return manage_argv("rqworker", "--with-scheduler", *WORKER_QUEUES)


class WorkerPool:
    """``manage.py rqworker --with-scheduler critical default bulk`` processes; with ``replace_dead`` a watcher
    replaces any that exits."""

    def __init__(
        self, count: int, env: dict[str, str], log_dir: Path, *, replace_dead: bool = True, unique_logs: bool = False
    ) -> None:
        self.env = env
        self.log_dir = log_dir
        self.unique_logs = unique_logs
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.workers: list[Child] = [self._spawn() for _ in range(count)]
        self.retired: list[Child] = []
        self.replacements = 0
        self._watcher = None
        if replace_dead:
            self._watcher = threading.Thread(target=self._watch, name="worker-pool", daemon=True)
            self._watcher.start()

    def _spawn(self) -> Child:
        name = "worker" if self.unique_logs else f"worker-{next(self._numbers)}"
        argv = worker_argv()
        return Child(name, argv, self.env, self.log_dir, unique_log=self.unique_logs)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                for index, worker in enumerate(self.workers):
                    if not worker.alive():
                        self.retired.append(worker)
                        self.workers[index] = self._spawn()
                        self.replacements += 1

    def live(self) -> list[Child]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def listening(self) -> bool:
        """Whether a live worker has started taking jobs (RQ logs it once, when its loop starts)."""
        return any(LISTENING in worker.output() for worker in self.live())

    def by_pid(self, pid: int) -> Child | None:
        with self._lock:
            return next((w for w in self.workers if w.pid == pid and w.alive()), None)

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        with self._lock:
            children = self.workers + self.retired
        # All at once, then wait with one grace period for all: a worker may take all of it to stop.
        for child in children:
            child.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children:
            child.stop(timeout=max(0.1, deadline - time.monotonic()))

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.tail(4000)}" for w in self.workers + self.retired)


def gunicorn_argv(port: int, *, processes: int, threads: int | None = None, timeout: int | None = None) -> list[str]:
    """gunicorn serving the project on 127.0.0.1: gthread workers with ``threads``, else gunicorn's sync workers."""
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "reliability_console.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(processes),
        "--graceful-timeout",
        "5",
        # As in production (docs/production.md): no credential of a URL or a header in gunicorn's own logs.
        "--logger-class",
        "reliability_console.gunicorn_logging.RedactingLogger",
    ]
    if threads is not None:
        argv += ["--worker-class", "gthread", "--threads", str(threads)]
    if timeout is not None:
        argv += ["--timeout", str(timeout)]
    return argv
