"""Helpers for tests that drive real processes: polling, worker pools, the sweeper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "var" / "test-logs"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, message: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def database_url() -> str:
    """The URL of the database the test process uses (the pytest-django test database)."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise RuntimeError("process tests need PostgreSQL: set DATABASE_URL=postgresql://…")
    name = connection.settings_dict["NAME"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgresql://{user}{password}@{host}:{port}/{name}"


def process_env(**overrides: Any) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "DJANGO_DEBUG": "1",
            "RELIABILITY_PIPELINE_MODULES": "tasks.demo.report_pipeline,tests.pipelines",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update({key: str(value) for key, value in overrides.items()})
    return env


class ManagedProcess:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.process.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            try:
                os.kill(self.process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        else:
            self.process.wait()
        self._log.close()

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


class WorkerPool:
    """Real ``manage.py rqworker --with-scheduler`` processes; optionally replaces dead ones."""

    def __init__(self, count: int, env: dict[str, str], *, replace_dead: bool = False) -> None:
        self.env = env
        self.workers: list[ManagedProcess] = []
        self.retired: list[ManagedProcess] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        for _ in range(count):
            self.workers.append(self._spawn())
        self._watcher = None
        if replace_dead:
            self._watcher = threading.Thread(target=self._watch, daemon=True)
            self._watcher.start()

    def _spawn(self) -> ManagedProcess:
        return ManagedProcess("worker", manage("rqworker", "--with-scheduler"), self.env)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                for index, worker in enumerate(self.workers):
                    if not worker.alive():
                        self.retired.append(worker)
                        self.workers[index] = self._spawn()

    def by_pid(self, pid: int) -> ManagedProcess | None:
        with self._lock:
            return next((w for w in self.workers if w.pid == pid), None)

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        with self._lock:
            for worker in self.workers + self.retired:
                worker.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.output()[-4000:]}" for w in self.workers + self.retired)


def pid_of_owner(lease_owner: str) -> int:
    """Worker identities end in ``:<pid>`` (see tasks.jobs.worker_identity)."""
    return int(lease_owner.rsplit(":", 1)[1])


class ApiServer:
    """gunicorn serving the project over real HTTP on 127.0.0.1, against the test database."""

    def __init__(self, env: dict[str, str], *, workers: int = 2, threads: int = 25, extra_args=()) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        argv = [
            sys.executable,
            "-m",
            "gunicorn",
            "reliability_console.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(threads),
            "--graceful-timeout",
            "5",
            *extra_args,
        ]
        self.process = ManagedProcess("gunicorn", argv, env)

        def ready():
            import urllib.request

            if not self.process.alive():
                raise AssertionError(f"gunicorn exited:\n{self.process.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/v1/openapi.json", timeout=1) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, timeout=30, message="gunicorn to answer")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.stop()
