"""A real deployment on this machine for one campaign, started and stopped as one.

PostgreSQL (a fresh database of the campaign's own on the given server, or on a throwaway cluster the
campaign starts), a private redis-server (or a primary, a replica and three Sentinels), the report-platform
simulator, gunicorn serving the API, N workers and the sweeper; optionally a PgBouncer in transaction mode
between every process and PostgreSQL. The campaign process itself uses Django against the same database
(through the same PgBouncer), to migrate, create its API token and read the outcome.
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
from chaos.topology import PgBouncer, PostgresCluster, SentinelRedis
from reliability_console.config import redact_url as redact

# gunicorn for the campaign's clients: 2 processes with threads for the 2 cores, as docs/performance.md's API figures.
WEB_PROCESSES = 2
WEB_THREADS = 16
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432"
# PgBouncer's own default: server sessions per database and user, shared by every client's transactions.
PGBOUNCER_POOL_SIZE = 20


@dataclass(frozen=True)
class DeploymentSettings:
    server_url: str | None  # None: the machine's default server, unless own_cluster
    database: str
    workers: int
    lease_seconds: float
    sweep_interval: float
    redelivery_grace: float
    simulator_args: tuple[str, ...]
    own_cluster: bool = False  # a throwaway PostgreSQL cluster of the campaign's own (initdb), instead of server_url
    pgbouncer: bool = False  # every connection through a PgBouncer in transaction mode
    sentinel: bool = False  # Redis as a primary, a replica and three Sentinels


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
        self.cluster = PostgresCluster(self.log_dir) if settings.own_cluster else None
        # The server as the campaign administers it (create, drop the database): never through the pooler.
        self.server_url = self.cluster.url if self.cluster else settings.server_url or DEFAULT_SERVER_URL
        self.pgbouncer = (
            PgBouncer(self.log_dir, self.server_url, pool_size=PGBOUNCER_POOL_SIZE) if settings.pgbouncer else None
        )
        # The database as every process of the deployment, the campaign's own included, reaches it.
        client_server_url = self.pgbouncer.url(self.server_url) if self.pgbouncer else self.server_url
        self.database_url = database_url(client_server_url, settings.database)
        self.redis: PrivateRedis | SentinelRedis = (
            SentinelRedis(self.log_dir) if settings.sentinel else PrivateRedis(self.log_dir)
        )
        self.simulator: Child | None = None
        self.web: Child | None = None
        self.sweeper: Child | None = None
        self.pool: WorkerPool | None = None
        self.simulator_url = ""
        self.api_url = ""
        self.api_token = ""
        self.env: dict[str, str] = {}

    def topology(self) -> dict[str, str]:
        """What ran, for the record and the report."""
        cluster = self.cluster
        server = f"own cluster on port {cluster.port} in {cluster.directory}" if cluster else redact(self.server_url)
        return {
            "postgresql": server,
            "pooler": f"pgbouncer, transaction mode, pool size {PGBOUNCER_POOL_SIZE}" if self.pgbouncer else "none",
            "redis": "sentinel: a primary, 1 replica, 3 sentinels" if self.settings.sentinel else "one redis-server",
        }

    # -- start ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.cluster is not None:
            self.cluster.start()
        self._create_database()
        if self.pgbouncer is not None:
            self.pgbouncer.start()
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
        from devtools import postgres

        admin = postgres.connect(database_url(self.server_url, "postgres"), autocommit=True)
        try:
            with admin.cursor() as cursor:
                # Only ever the campaign's own database: FORCE ends sessions a crashed run left behind.
                cursor.execute(f'DROP DATABASE IF EXISTS "{self.settings.database}" WITH (FORCE)')
                cursor.execute(f'CREATE DATABASE "{self.settings.database}"')
        finally:
            admin.close()

    @property
    def metrics_dir(self) -> Path:
        """Where every process of the deployment keeps its Prometheus metrics (multiprocess mode)."""
        return self.run_dir / "prometheus"

    def _environment(self) -> dict[str, str]:
        metrics_dir = self.metrics_dir
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "DATABASE_POOLER": "transaction" if self.pgbouncer else "none",
                **self.redis.env(),
                "REPORT_PLATFORM_URL": self.simulator_url,
                "DJANGO_SECRET_KEY": env.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
                "DJANGO_DEBUG": "0",
                "DJANGO_SECURE_HTTPS": "0",  # plain HTTP on 127.0.0.1
                # The demo's report pipeline and the campaign's limited copy of it (chaos.pipelines).
                "RELIABILITY_PIPELINE_MODULES": "tasks.demo.report_pipeline,chaos.pipelines",
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
        from tasks.lifecycle.clients import api_client_create

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
        if self.sweeper is not None:
            self.sweeper.terminate()  # stops while the workers do
        if self.pool is not None:
            self.pool.stop()
        if self.sweeper is not None:
            self.sweeper.stop()

    def stop(self, *, drop_database: bool) -> None:
        """Stop everything; ``drop_database`` drops the campaign's database (an own cluster: deletes it whole)."""
        self.stop_workers()
        for child in (self.web, self.simulator):
            if child is not None:
                child.stop()
        self.redis.stop()
        from django.apps import apps

        if apps.ready:  # the campaign's own sessions, before their server goes
            from django.db import connections

            connections.close_all()
        if self.pgbouncer is not None:
            self.pgbouncer.stop()
        if self.cluster is not None:
            if drop_database:
                self.cluster.remove()
            else:
                self.cluster.stop()
        elif drop_database:
            from devtools import postgres

            admin = postgres.connect(database_url(self.server_url, "postgres"), autocommit=True)
            try:
                with admin.cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{self.settings.database}" WITH (FORCE)')
            finally:
                admin.close()
