"""A real deployment on this machine for one campaign, started and stopped as one.

PostgreSQL (a fresh database of the campaign's own on the given server), a private redis-server, the
report-platform simulator, gunicorn serving the API, N workers and the sweeper. The campaign process
itself uses Django against the same database, to migrate, create its API token and read the outcome.
"""

from __future__ import annotations

import os
import secrets
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from chaos.processes import (
    Child,
    DeploymentError,
    PrivateRedis,
    WorkerPool,
    free_port,
    gunicorn_argv,
    manage_argv,
    wait_until,
)

# gunicorn for the campaign's clients: 2 processes with threads, as the README suggests for 2 cores.
WEB_PROCESSES = 2
WEB_THREADS = 16


@dataclass(frozen=True)
class DeploymentSettings:
    server_url: str
    database: str
    workers: int
    lease_seconds: float
    sweep_interval: float
    redelivery_grace: float
    simulator_args: tuple[str, ...]


def database_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Deployment:
    """Everything a campaign runs against; ``stop()`` ends every process it started."""

    def __init__(self, settings: DeploymentSettings, run_dir: Path) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.database_url = database_url(settings.server_url, settings.database)
        self.redis = PrivateRedis(self.log_dir)
        self.simulator: Child | None = None
        self.web: Child | None = None
        self.sweeper: Child | None = None
        self.pool: WorkerPool | None = None
        self.simulator_url = ""
        self.api_url = ""
        self.api_token = ""
        self.env: dict[str, str] = {}

    # -- start ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._create_database()
        self.redis.start()
        sim_port = free_port()
        self.simulator_url = f"http://127.0.0.1:{sim_port}"
        self.env = self._environment()
        self.simulator = Child(
            "report-platform",
            manage_argv("run_report_platform", "--port", str(sim_port), *self.settings.simulator_args),
            self.env,
            self.log_dir,
        )
        wait_until(lambda: _http_ok(self.simulator_url + "/_sim/health"), 30, "the report-platform simulator")
        self._setup_django()
        self.web = self._start_web()
        self.sweeper = Child("sweeper", manage_argv("run_sweeper"), self.env, self.log_dir)
        self.pool = WorkerPool(self.settings.workers, self.env, self.log_dir)

    def _create_database(self) -> None:
        import psycopg2

        admin = psycopg2.connect(database_url(self.settings.server_url, "postgres"))
        admin.autocommit = True
        try:
            with admin.cursor() as cursor:
                # Only ever the campaign's own database: FORCE ends sessions a crashed run left behind.
                cursor.execute(f'DROP DATABASE IF EXISTS "{self.settings.database}" WITH (FORCE)')
                cursor.execute(f'CREATE DATABASE "{self.settings.database}"')
        finally:
            admin.close()

    def _environment(self) -> dict[str, str]:
        metrics_dir = self.run_dir / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis.url,
                "REPORT_PLATFORM_URL": self.simulator_url,
                "DJANGO_SECRET_KEY": env.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
                "DJANGO_DEBUG": "0",
                "RELIABILITY_PIPELINE_MODULES": "tasks.demo.report_pipeline",
                "RELIABILITY_LEASE_SECONDS": str(self.settings.lease_seconds),
                "RELIABILITY_SWEEP_INTERVAL_SECONDS": str(self.settings.sweep_interval),
                "RELIABILITY_REDELIVERY_GRACE_SECONDS": str(self.settings.redelivery_grace),
                "RELIABILITY_VAR_DIR": str(self.run_dir),
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _setup_django(self) -> None:
        os.environ.update(self.env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "reliability_console.settings"
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", "--noinput", verbosity=0)
        from tasks.clients import api_client_create

        _, self.api_token = api_client_create(name="chaos")

    def _start_web(self) -> Child:
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        argv = gunicorn_argv(port, processes=WEB_PROCESSES, threads=WEB_THREADS)
        web = Child("web", argv, self.env, self.log_dir)

        def ready() -> bool:
            if not web.alive():
                raise DeploymentError(f"gunicorn exited:\n{web.tail()}")
            return _http_ok(self.api_url + "/api/v1/openapi.json")

        wait_until(ready, 60, "gunicorn")
        return web

    # -- stop -------------------------------------------------------------------------------------------------------

    def stop_workers(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        if self.sweeper is not None:
            self.sweeper.stop()

    def stop(self, *, drop_database: bool) -> None:
        self.stop_workers()
        for child in (self.web, self.simulator):
            if child is not None:
                child.stop()
        self.redis.stop()
        if drop_database:
            from django.db import connections

            connections.close_all()
            import psycopg2

            admin = psycopg2.connect(database_url(self.settings.server_url, "postgres"))
            admin.autocommit = True
            try:
                with admin.cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{self.settings.database}" WITH (FORCE)')
            finally:
                admin.close()
