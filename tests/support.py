"""Helpers for tests that drive real processes: polling, worker pools, the sweeper."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from chaos import processes as chaos_processes
from chaos.processes import Child, DeploymentError, gunicorn_argv, wait_until, worker_pid
from devtools import postgres
from tasks.models.door import door_forced

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "var" / "test-logs"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, message: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    try:
        return wait_until(predicate, timeout, message or str(predicate), interval=interval)
    except DeploymentError as exc:
        raise AssertionError(f"timed out: {exc}") from None


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


@contextmanager
def throwaway_database(prefix: str) -> Iterator[dict[str, str]]:
    """A new, empty database on the test run's PostgreSQL server, dropped afterwards: its Django ``DATABASES``
    entry (NAME, USER, PASSWORD, HOST, PORT), for a process that migrates one of its own."""
    db = settings.DATABASES["default"]
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    server = {"host": db.get("HOST") or "127.0.0.1", "port": db.get("PORT") or 5432, "user": db.get("USER")}
    admin = postgres.connect(dbname="postgres", password=db.get("PASSWORD") or None, autocommit=True, **server)
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {
            "NAME": name,
            "USER": server["user"] or "postgres",
            "PASSWORD": db.get("PASSWORD") or "",
            "HOST": server["host"],
            "PORT": str(server["port"]),
        }
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def checkout_wheel(base: Path, *, env: dict[str, str], log: Path, timeout: float) -> Path:
    """The wheel of this checkout as a clean clone with this change would build it, in ``base / "wheels"``.

    The files copied are the tracked and new ones, none that git ignores (so no ``.venv``, ``var`` or build
    leftovers reach the wheel); the copy is gone once the wheel is built.
    """
    source, wheels = base / "source", base / "wheels"
    tracked_and_new = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(tracked_and_new, cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        if (ROOT / relative).is_file():
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, source / relative)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source)]
    with open(log, "a") as output:
        result = subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    assert result.returncode == 0, f"building the wheel failed, see {log}"
    shutil.rmtree(source)
    (wheel,) = wheels.glob("reliability_console-*.whl")
    return wheel


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


class ManagedProcess(Child):
    """A child process of a test, its log under var/test-logs/."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(name, argv, env, LOG_DIR, unique_log=True)


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


class WorkerPool(chaos_processes.WorkerPool):
    """Real ``manage.py rqworker --with-scheduler critical default bulk`` processes; optionally replaces dead ones."""

    def __init__(self, count: int, env: dict[str, str], *, replace_dead: bool = False) -> None:
        super().__init__(count, env, LOG_DIR, replace_dead=replace_dead, unique_logs=True)


def pid_of_owner(lease_owner: str) -> int:
    pid = worker_pid(lease_owner)
    assert pid is not None, f"no process id in worker identity {lease_owner!r}"
    return pid


class ApiServer:
    """gunicorn serving the project over real HTTP on 127.0.0.1, against the test database."""

    def __init__(
        self, env: dict[str, str], *, workers: int = 2, threads: int = 25, extra_args=(), python: str = sys.executable
    ) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        # ``python``: another environment's interpreter (it must have the project installed).
        argv = [python, *gunicorn_argv(self.port, processes=workers, threads=threads)[1:], *extra_args]
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


def parked_dead_letters(count: int) -> list:
    """``count`` tasks of ``t_parked`` run once and failed: each leaves an open dead letter (FAILED task)."""
    return _dead_letters(count, "t_parked", {"fail": True})


def compensated_dead_letters(count: int) -> list:
    """``count`` tasks of ``t_local`` failed and compensated: dead letters a retry from checkpoint refuses."""
    return _dead_letters(count, "t_local", {"fail_b": "permanent"})


def _dead_letters(count: int, pipeline: str, input_: dict) -> list:
    from dlq.models import DLQItem
    from tasks.execution.runner import task_run
    from tasks.submission.submit import task_submit

    items = []
    for _ in range(count):
        task = task_submit(pipeline=pipeline, input=input_)
        task_run(task_id=str(task.pk), worker="seed")
        items.append(DLQItem.objects.get(task=task))
    return items


def aged_audit_entry(*, age, actor: str = "operator1", **fields):
    """An audit entry (a close of DLQ item 7 unless ``fields`` say otherwise) made ``age`` (a timedelta) ago."""
    from django.db import transaction
    from django.utils import timezone

    from dlq.audit import audit_record
    from dlq.models import AuditOutcome

    made = audit_record(
        actor=actor,
        **{"action": "close", "target_type": "dlqitem", "target_id": "7", "outcome": AuditOutcome.SUCCEEDED, **fields},
    )
    # Ageing an entry is itself an UPDATE the trigger refuses: only the test's own transaction may, with the
    # trigger switched off for it (the owner's privilege, as a restore would).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("UPDATE dlq_auditentry SET created_at = %s WHERE id = %s", [timezone.now() - age, made.pk])
    return made


def planner_statistics_of_a_live_table(tasks: int = 2000) -> None:
    """Give PostgreSQL's planner the table shape production has before a test EXPLAINs a query.

    Most tasks unfinished, and statistics that say so: left to autovacuum, the
    statistics are whatever earlier tests left behind, and the planner may then
    walk another index with a filter instead of the partial index under test.
    """
    from tasks.models import Task

    with door_forced():
        Task.objects.bulk_create(Task(pipeline="t_local", input={}) for _ in range(tasks))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Task._meta.db_table}")


def plan_uses_index(query, index: str) -> str:
    """EXPLAIN ``query`` with sequential scans off and every other droppable index of its table gone; the plan.

    What is asked is whether the query implies the partial index's predicate, not which of several usable
    indexes the planner prefers on whatever statistics earlier tests left: so, inside a transaction rolled
    back at the end, every index of the table that backs no constraint except ``index`` is dropped. The
    plan then names ``index`` only if the query can use it.
    """
    # Compiled inside the transaction: a SELECT … FOR UPDATE compiles only there.
    return _plan_with_one_index(query.model._meta.db_table, index, query.query.sql_with_params)


_INDEX_SCAN = re.compile(r"(Index Only Scan|Index Scan|Bitmap Index Scan) (?:using|on) (\S+)")


def index_scans(plan: str) -> list[tuple[str, str]]:
    """Each index scan of an EXPLAIN plan as ``(kind, index)``, in the plan's order.

    Which kind PostgreSQL picks for one index (index-only, plain, bitmap) depends on the visibility map and
    the statistics earlier tests left, not on the query: tests name the index, and the kind only when it
    matters (a bitmap scan does not read the index in its order).
    """
    return _INDEX_SCAN.findall(plan)


def statement_plan_uses_index(sql: str, *, table: str, index: str) -> str:
    """``plan_uses_index`` for a statement as executed (``CaptureQueriesContext``'s SQL, its values in it)."""
    return _plan_with_one_index(table, index, lambda: (sql, None))


def _plan_with_one_index(table: str, index: str, statement) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        sql, params = statement()
        cursor.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i WHERE i.indrelid = %s::regclass"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
            " AND i.indexrelid::regclass::text <> %s",
            [table, index],
        )
        for (other,) in cursor.fetchall():
            cursor.execute(f"DROP INDEX {other}")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def rule_form(**fields) -> dict:
    """The admin's alert rule form, filled in: ``fields`` override (None leaves a field out)."""
    form = {
        "name": "open items",
        "kind": "open_items",
        "pipeline": "",
        "enabled": "on",
        "threshold": "5",
        "window_seconds": "3600",
        "lookback_days": "7",
        "renotify_seconds": "3600",
    }
    form.update(fields)
    return {name: value for name, value in form.items() if value is not None}


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of the [start, end] intervals under way at one moment.

    At equal times an end counts before a start: a slot is given back (the end recorded) before the next
    task can take it, so a start stamped in the same millisecond as an end did not overlap it.
    """
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def work_intervals(task_ids: list[str], platform) -> list[tuple[int, int]]:
    """When the platform simulator saw each piece of the tasks' work begin and end (ms): the far side's view."""
    wanted = set(task_ids)
    work = [w for w in platform.state()["work"] if w["task_id"] in wanted]
    assert all(w["finished_ms"] is not None for w in work)
    return [(w["received_ms"], w["finished_ms"]) for w in work]


def attempt_intervals(task_ids: list[str]) -> list[tuple[float, float]]:
    """When each step attempt of the tasks began and ended, as the workers recorded them (s)."""
    from tasks.models import AttemptKind, StepAttempt

    rows = StepAttempt.objects.filter(task_id__in=task_ids, kind=AttemptKind.STEP).values_list(
        "started_at", "finished_at"
    )
    return [(start.timestamp(), end.timestamp()) for start, end in rows]
