"""`make bench` (console part): time the operator pages on millions of rows, through a real web server.

Creates a dedicated PostgreSQL database (``rc_bench`` by default, dropped and
created again, and dropped at the end unless ``--keep``), migrates it, seeds
it with ``manage.py seed_scale_data`` (5,000,000 tasks and 1,000,000 DLQ
items by default), starts gunicorn against it with ``DJANGO_DEBUG=0``, logs
in as a superuser with a real session and times each page: one warm-up
request, then ``--requests`` more; it reports the median and the 95th
percentile. It also renders each page once in-process to count its SQL
statements and name the slowest.

It is a benchmark, not a test: a slow page is a figure in the table, and the
exit status is non-zero only when something crashed (or a page answered
with an error). Results go to ``var/bench/console.json``.

``run(...)`` does the work and returns the results, for a wider benchmark to
call; ``main()`` is the command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_db import database_url
from bench_db import drop_database as _drop_database
from bench_db import recreate_database as _recreate_database
from bench_db import scalar as _scalar

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "var" / "bench" / "console.json"
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432"
# Database 15 of the local Redis: the dashboard reads queue lengths from it, and nothing else uses it.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
BENCH_USERNAME = "bench-admin"
TARGET_MS = 1000
SERVER_START_TIMEOUT = 60
# Generous: a page slower than a minute is a result to report, not a reason for gunicorn to kill its worker.
WORKER_TIMEOUT_SECONDS = 300
REQUEST_TIMEOUT_SECONDS = 300
SLOWEST_QUERY_CHARACTERS = 1000
# The name is put into DROP DATABASE: a plain identifier only.
DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class BenchError(Exception):
    """The benchmark could not run (a command failed, the server did not start, a page answered an error)."""


@dataclass
class PageResult:
    name: str
    path: str
    median_ms: float
    p95_ms: float
    under_1s: bool
    samples_ms: list[float] = field(default_factory=list)
    queries: int | None = None
    slowest_query_ms: float | None = None
    slowest_query: str | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _seeded_counts(url: str) -> tuple[int, int] | None:
    """(tasks, DLQ items) of an existing bench database, or None if it is not migrated."""
    if _scalar(url, "SELECT to_regclass('dlq_dlqitem') IS NOT NULL") is not True:
        return None
    return _scalar(url, "SELECT count(*) FROM tasks_task"), _scalar(url, "SELECT count(*) FROM dlq_dlqitem")


def _database_exists(server_url: str, name: str) -> bool:
    return bool(_scalar(database_url(server_url, "postgres"), "SELECT 1 FROM pg_database WHERE datname = %s", [name]))


def _manage(env: dict, *args: str, stream: bool = False) -> str:
    argv = [sys.executable, "manage.py", *args]
    if stream:
        # The seeding command's progress lines go straight to the terminal.
        result = subprocess.run(argv, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        output = ""
    else:
        result = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
        output = result.stdout
    if result.returncode != 0:
        raise BenchError(f"manage.py {' '.join(args)} failed:\n{result.stderr.strip()[-3000:]}")
    return output


def _percentile(samples: list[float], fraction: float) -> float:
    if len(samples) == 1:
        return samples[0]
    # Linear interpolation between the closest ranks (statistics.quantiles' "inclusive" method).
    ordered = sorted(samples)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Server:
    """gunicorn against the bench database, in its own process group; stopped by its PID."""

    def __init__(self, env: dict, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        import requests

        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "reliability_console.wsgi:application",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
                "--timeout",
                str(WORKER_TIMEOUT_SECONDS),
            ],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        log.close()
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"gunicorn exited with code {self.process.returncode}; see {self.log_path}")
            try:
                if requests.get(f"{self.base_url}/admin/login/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise BenchError(f"gunicorn did not answer within {SERVER_START_TIMEOUT}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _login(base_url: str, username: str, password: str):
    import requests

    session = requests.Session()
    session.get(f"{base_url}/admin/login/", timeout=REQUEST_TIMEOUT_SECONDS).raise_for_status()
    response = session.post(
        f"{base_url}/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
            "username": username,
            "password": password,
            "next": "/admin/",
        },
        allow_redirects=False,
        timeout=REQUEST_TIMEOUT_SECONDS,
    )
    if response.status_code != 302 or "sessionid" not in session.cookies:
        raise BenchError(f"could not log in as {username!r} (HTTP {response.status_code})")
    return session


def _time_page(session, base_url: str, path: str, requests_per_page: int) -> list[float]:
    samples = []
    for index in range(requests_per_page + 1):
        started = time.perf_counter()
        response = session.get(f"{base_url}{path}", allow_redirects=False, timeout=REQUEST_TIMEOUT_SECONDS)
        body = response.content
        elapsed_ms = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise BenchError(f"GET {path} answered HTTP {response.status_code}: {body[:300]!r}")
        if index:  # the first request only warms caches
            samples.append(round(elapsed_ms, 1))
    return samples


def _bench_pages(url: str) -> list[tuple[str, str]]:
    """The pages to time, with a DLQ item and a task that have attempts, checkpoints and side effects."""
    row = _scalar(
        url,
        "SELECT json_build_array(id, task_id) FROM dlq_dlqitem "
        "WHERE status = 'open' AND task_id IN (SELECT task_id FROM tasks_stepattempt) ORDER BY id LIMIT 1",
    ) or _scalar(url, "SELECT json_build_array(id, task_id) FROM dlq_dlqitem ORDER BY id LIMIT 1")
    if row is None:
        raise BenchError("the bench database holds no DLQ item")
    item_id, task_id = row
    return [
        ("DLQ list", "/admin/dlq/dlqitem/"),
        ("DLQ list, filtered", "/admin/dlq/dlqitem/?status__exact=open&pipeline__exact=report"),
        ("DLQ item page", f"/admin/dlq/dlqitem/{item_id}/change/"),
        ("task list", "/admin/tasks/task/"),
        ("task list, filtered", "/admin/tasks/task/?state=failed&pipeline=report"),
        ("task page", f"/admin/tasks/task/{task_id}/change/"),
        ("dashboard", "/admin/dashboard/"),
    ]


def _count_queries(env: dict, paths: list[str]) -> dict[str, dict]:
    """Render each page in-process (in a child with the bench settings): its SQL statements and the slowest one."""
    result = subprocess.run(
        [sys.executable, __file__, "--count-queries", *paths], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise BenchError(f"counting SQL statements failed:\n{result.stderr.strip()[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _count_queries_child(paths: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1")
    user = get_user_model().objects.get(username=BENCH_USERNAME)
    client.force_login(user, backend="django.contrib.auth.backends.ModelBackend")
    found = {}
    for path in paths:
        client.get(path)  # warm, as the timed requests are
        with CaptureQueriesContext(connection) as captured:
            status = client.get(path).status_code
        slowest = max(captured.captured_queries, key=lambda query: float(query["time"]), default=None)
        found[path] = {
            "status": status,
            "queries": len(captured.captured_queries),
            "slowest_query_ms": round(float(slowest["time"]) * 1000, 1) if slowest else None,
            "slowest_query": slowest["sql"][:SLOWEST_QUERY_CHARACTERS] if slowest else None,
        }
    print(json.dumps(found))


def run(
    *,
    tasks: int = 5_000_000,
    dlq_items: int = 1_000_000,
    database: str = "rc_bench",
    keep: bool = False,
    requests_per_page: int = 10,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Seed (or reuse, with ``keep``) the bench database, time the console pages, write ``output``; return it."""
    if not DATABASE_NAME.fullmatch(database):
        raise BenchError(f"--database {database!r}: use letters, digits and underscores only")
    url = database_url(server_url, database)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
    }
    log_dir = (output.parent if output else ROOT / "var" / "bench").resolve()
    log_dir.mkdir(parents=True, exist_ok=True)

    seed_seconds = None
    counts = _seeded_counts(url) if keep and _database_exists(server_url, database) else None
    if counts == (tasks, dlq_items):
        progress(f"bench: reusing database {database!r} ({tasks:,} tasks, {dlq_items:,} DLQ items)")
        _manage(env, "migrate", "--noinput")
    else:
        progress(f"bench: creating database {database!r}")
        _recreate_database(server_url, database)
        _manage(env, "migrate", "--noinput")
        progress(f"bench: seeding {tasks:,} tasks and {dlq_items:,} DLQ items")
        started = time.monotonic()
        _manage(env, "seed_scale_data", "--tasks", str(tasks), "--dlq-items", str(dlq_items), stream=True)
        seed_seconds = round(time.monotonic() - started, 1)
    password = _manage(env, "bootstrap_admin", "--username", BENCH_USERNAME).rsplit("password: ", 1)[-1].strip()

    server = Server(env, log_dir / "gunicorn.log")
    try:
        server.start()
        progress(f"bench: gunicorn (2 workers) on {server.base_url}, pid {server.process.pid}")
        session = _login(server.base_url, BENCH_USERNAME, password)
        pages = []
        for name, path in _bench_pages(url):
            samples = _time_page(session, server.base_url, path, requests_per_page)
            median = round(statistics.median(samples), 1)
            pages.append(
                PageResult(
                    name=name,
                    path=path,
                    median_ms=median,
                    p95_ms=round(_percentile(samples, 0.95), 1),
                    under_1s=median < TARGET_MS,
                    samples_ms=samples,
                )
            )
            progress(f"bench: {name}: median {median:.0f} ms")
    finally:
        server.stop()

    progress("bench: counting each page's SQL statements")
    try:
        counted = _count_queries(env, [page.path for page in pages])
    except BenchError as exc:
        # Optional figures: the timings stand without them.
        progress(f"bench: {exc}")
        counted = {}
    for page in pages:
        found = counted.get(page.path, {})
        page.queries = found.get("queries")
        page.slowest_query_ms = found.get("slowest_query_ms")
        page.slowest_query = found.get("slowest_query")

    results = {
        "pages": [asdict(page) for page in pages],
        "tasks": tasks,
        "dlq_items": dlq_items,
        "requests_per_page": requests_per_page,
        "seed_seconds": seed_seconds,
        "database": database,
        "environment": {
            "cpus": os.cpu_count(),
            "postgresql": _scalar(url, "SHOW server_version"),
            "python": sys.version.split()[0],
        },
    }
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
    if not keep:
        _drop_database(server_url, database)
    return results


def format_table(results: dict) -> str:
    header = f"{'page':<22} {'median ms':>10} {'p95 ms':>8}  {'< 1 s':<5} {'SQL':>4} {'slowest SQL ms':>15}"
    lines = [
        f"Console pages, {results['tasks']:,} tasks and {results['dlq_items']:,} DLQ items, "
        f"{results['requests_per_page']} requests each after one warm-up:",
        header,
        "-" * len(header),
    ]
    for page in results["pages"]:
        slowest = "" if page["slowest_query_ms"] is None else f"{page['slowest_query_ms']:.0f}"
        lines.append(
            f"{page['name']:<22} {page['median_ms']:>10.0f} {page['p95_ms']:>8.0f}  "
            f"{'yes' if page['under_1s'] else 'NO':<5} {page['queries'] or '':>4} {slowest:>15}"
        )
    if results.get("seed_seconds") is not None:
        lines.append(f"seeding took {results['seed_seconds']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000_000)
    parser.add_argument("--dlq-items", type=int, default=1_000_000)
    parser.add_argument("--database", default="rc_bench", help="name of the database to create (default rc_bench)")
    parser.add_argument("--keep", action="store_true", help="keep the database, and reuse it if already seeded")
    parser.add_argument("--requests", type=int, default=10, help="timed requests per page (default 10)")
    parser.add_argument("--server-url", default=DEFAULT_SERVER_URL, help="PostgreSQL server, without a database")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--count-queries", nargs="+", metavar="PATH", help=argparse.SUPPRESS)  # the child's mode
    options = parser.parse_args(argv)
    if options.count_queries:
        _count_queries_child(options.count_queries)
        return 0
    for name in ("tasks", "dlq_items", "requests"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
    try:
        results = run(
            tasks=options.tasks,
            dlq_items=options.dlq_items,
            database=options.database,
            keep=options.keep,
            requests_per_page=options.requests,
            server_url=options.server_url,
            redis_url=options.redis_url,
            output=options.output,
        )
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print()
    print(format_table(results))
    print(f"\nwritten to {options.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
