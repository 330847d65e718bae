"""`make bench` (console part): time the operator pages on millions of rows, through a real web server.

Creates a dedicated PostgreSQL database (``rc_bench`` by default, dropped and
created again, and dropped at the end unless ``--keep``), migrates it, seeds
it with ``manage.py seed_scale_data`` (5,000,000 tasks and 1,000,000 DLQ
items by default), starts gunicorn against it with ``DJANGO_DEBUG=0``, logs
in as a superuser with a real session and times each page: one warm-up
request, then ``--requests`` more; it reports the median and the 95th
percentile. It also renders each page once in-process to count its SQL
statements and name the slowest.

Seeding takes minutes; to time the pages again without it, pass ``--keep``
every time: a run with ``--keep`` finds the database it kept, and when it
holds exactly ``--tasks`` tasks and ``--dlq-items`` items it only migrates
it (so a new index is built on the seeded rows) and times the pages again;
otherwise it seeds afresh. Without ``--keep`` the database is recreated and
dropped at the end.

Each page's floor is a median under ``TARGET_MS``. It is a benchmark, not a
test: a slow page is a figure in the table, and the exit status is non-zero
only when something crashed (or a page answered with an error). Results go
to ``var/bench/console.json``.

``run(...)`` does the work and returns the results, for a wider benchmark to
call; ``PART.main()`` is the command line.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_db import database_url, drop_database, scalar
from bench_part import Option, Part, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_SERVER_URL,
    ROOT,
    BenchError,
    check_database_name,
    create_migrated_database,
    log_directory,
    manage,
    project_env,
    run_command,
    start_web_server,
)

from chaos.processes import free_port, gunicorn_argv  # bench_processes put the repository root on sys.path

DEFAULT_OUTPUT = BENCH_DIR / "console.json"
# Database 15 of the local Redis: the dashboard reads queue lengths from it, and nothing else uses it.
CONSOLE_REDIS_URL = "redis://127.0.0.1:6379/15"
BENCH_USERNAME = "bench-admin"
# The floor of every page: its median, server-side, at 5 M tasks and 1 M dead letters.
TARGET_MS = 200
# Generous: a page slower than a minute is a result to report, not a reason for gunicorn to kill its worker.
WORKER_TIMEOUT_SECONDS = 300
REQUEST_TIMEOUT_SECONDS = 300
SLOWEST_QUERY_CHARACTERS = 1000
# Tables whose visibility map the results report: the pages' index-only scans skip the table only on
# pages marked all-visible. Seeds' VACUUMs left 80 % and 100 % of the DLQ's pages unmarked (held back by
# another session's older snapshot), and the dashboard took 585 ms instead of 135: the seed now vacuums again
# once such snapshots are gone (devtools.scale_data.vacuum), and the share is printed with the table.
VISIBILITY_TABLES = ("tasks_task", "dlq_dlqitem")


OPTIONS = (
    Option("tasks", type=positive_int, default=5_000_000, help="tasks to seed"),
    Option("dlq_items", type=positive_int, default=1_000_000, help="DLQ items to seed"),
    Option("database", default="rc_bench", help="the console's database (default rc_bench)"),
    Option(
        "requests_per_page",
        flag="requests",
        type=positive_int,
        default=10,
        help="timed requests per page (default 10)",
    ),
    Option("redis_url", default=CONSOLE_REDIS_URL, help="the console's Redis"),
)


@dataclass
class PageResult:
    name: str
    path: str
    median_ms: float
    p95_ms: float
    under_target: bool  # median < TARGET_MS
    samples_ms: list[float] = field(default_factory=list)
    queries: int | None = None
    slowest_query_ms: float | None = None
    slowest_query: str | None = None


def _seeded_counts(url: str) -> tuple[int, int] | None:
    """(tasks, DLQ items) of an existing bench database, or None if it is not migrated."""
    if scalar(url, "SELECT to_regclass('dlq_dlqitem') IS NOT NULL") is not True:
        return None
    return scalar(url, "SELECT count(*) FROM tasks_task"), scalar(url, "SELECT count(*) FROM dlq_dlqitem")


def _database_exists(server_url: str, name: str) -> bool:
    return bool(scalar(database_url(server_url, "postgres"), "SELECT 1 FROM pg_database WHERE datname = %s", [name]))


def _all_visible_shares(url: str) -> dict[str, float]:
    """Per table, the share of its pages marked all-visible (as the last VACUUM or ANALYZE counted them)."""
    return scalar(
        url,
        "SELECT json_object_agg(relname, round((relallvisible::numeric / greatest(relpages, 1)), 3))"
        " FROM pg_class WHERE relname = ANY(%s)",
        [list(VISIBILITY_TABLES)],
    )


def _percentile(samples: list[float], fraction: float) -> float:
    if len(samples) == 1:
        return samples[0]
    # Linear interpolation between the closest ranks (statistics.quantiles' "inclusive" method).
    ordered = sorted(samples)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _gunicorn_argv(port: int) -> list[str]:
    # gunicorn's default sync workers (not the API's gthread ones): the pages are timed one request at a time.
    return gunicorn_argv(port, processes=2, timeout=WORKER_TIMEOUT_SECONDS)


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
    row = scalar(
        url,
        "SELECT json_build_array(id, task_id) FROM dlq_dlqitem "
        "WHERE status = 'open' AND task_id IN (SELECT task_id FROM tasks_stepattempt) ORDER BY id LIMIT 1",
    ) or scalar(url, "SELECT json_build_array(id, task_id) FROM dlq_dlqitem ORDER BY id LIMIT 1")
    if row is None:
        raise BenchError("the bench database holds no DLQ item")
    item_id, task_id = row
    # A seeded order and the customer of a dead letter (devtools.scale_data: every task has a customer_id, an
    # invoice an order_id), searched through the attributes' GIN index.
    order = scalar(url, "SELECT attributes->>'order_id' FROM tasks_task WHERE pipeline = 'invoice' LIMIT 1")
    customer = scalar(url, f"SELECT t.attributes->>'customer_id' FROM tasks_task t WHERE t.id = '{task_id}'")
    return [
        ("DLQ list", "/admin/dlq/dlqitem/"),
        ("DLQ list, filtered", "/admin/dlq/dlqitem/?status__exact=open&pipeline__exact=report"),
        ("DLQ item page", f"/admin/dlq/dlqitem/{item_id}/change/"),
        ("task list", "/admin/tasks/task/"),
        ("task list, filtered", "/admin/tasks/task/?state=failed&pipeline=report"),
        ("task page", f"/admin/tasks/task/{task_id}/change/"),
        ("task list, by order_id", f"/admin/tasks/task/?q=order_id:{order}"),
        ("DLQ list, by customer_id", f"/admin/dlq/dlqitem/?q=customer_id:{customer}"),
        ("dashboard", "/admin/dashboard/"),
        ("pipelines", "/admin/pipelines/"),
        ("queues", "/admin/queues/"),
        ("schedules", "/admin/schedules/"),
        ("approval inbox", "/admin/approvals/"),
    ]


def _count_queries(env: dict, paths: list[str]) -> dict[str, dict]:
    """Render each page in-process (in a child with the bench settings): its SQL statements and the slowest one."""
    output = run_command([sys.executable, __file__, "--count-queries", *paths], env, "counting SQL statements")
    return json.loads(output.strip().splitlines()[-1])


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
    redis_url: str = CONSOLE_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Seed (or reuse, with ``keep``) the bench database, time the console pages, write ``output``; return it."""
    check_database_name(database)
    url = database_url(server_url, database)
    # As the pages were first measured: the seeded pipelines only, not the bench ones; and the one declaring the
    # search attributes the seeded tasks carry.
    env = project_env(
        url,
        redis_url,
        RELIABILITY_ENABLE_BENCH_PIPELINES="0",
        RELIABILITY_PIPELINE_MODULES="tasks.demo.report_pipeline,devtools.scale_data.pipelines",
    )
    log_dir = log_directory(output)

    seed_seconds = None
    counts = _seeded_counts(url) if keep and _database_exists(server_url, database) else None
    if counts == (tasks, dlq_items):
        progress(f"bench: reusing database {database!r} ({tasks:,} tasks, {dlq_items:,} DLQ items)")
        manage(env, "migrate", "--noinput")
    else:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        progress(f"bench: seeding {tasks:,} tasks and {dlq_items:,} DLQ items")
        started = time.monotonic()
        manage(env, "seed_scale_data", "--tasks", str(tasks), "--dlq-items", str(dlq_items), stream=True)
        seed_seconds = round(time.monotonic() - started, 1)
    all_visible = _all_visible_shares(url)
    password = manage(env, "bootstrap_admin", "--username", BENCH_USERNAME).rsplit("password: ", 1)[-1].strip()

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = start_web_server(_gunicorn_argv(port), port, env, log_dir / "gunicorn.log", "/admin/login/")
    try:
        progress(f"bench: gunicorn (2 workers) on {base_url}, pid {server.processes[0].pid}")
        session = _login(base_url, BENCH_USERNAME, password)
        pages = []
        for name, path in _bench_pages(url):
            samples = _time_page(session, base_url, path, requests_per_page)
            median = round(statistics.median(samples), 1)
            pages.append(
                PageResult(
                    name=name,
                    path=path,
                    median_ms=median,
                    p95_ms=round(_percentile(samples, 0.95), 1),
                    under_target=median < TARGET_MS,
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

    figures, floors = _summary(pages)
    results = {
        "figures": figures,
        "floors": floors,
        "pages": [asdict(page) for page in pages],
        "tasks": tasks,
        "dlq_items": dlq_items,
        "requests_per_page": requests_per_page,
        "seed_seconds": seed_seconds,
        "database": database,
        "environment": {
            "cpus": os.cpu_count(),
            "postgresql": scalar(url, "SHOW server_version"),
            "python": sys.version.split()[0],
            "all_visible_pages": all_visible,
        },
    }
    write_results(output, results)
    if not keep:
        drop_database(server_url, database)
    return results


def _summary(pages: list[PageResult]) -> tuple[dict, list[dict]]:
    """The figures and floors of the timed pages, for ``make bench``'s results."""
    figures, floors = {}, []
    for page in pages:
        figures[f"console.{page.name}.median"] = {"value": page.median_ms, "unit": "ms"}
        figures[f"console.{page.name}.p95"] = {"value": page.p95_ms, "unit": "ms"}
        floors.append(
            {
                "name": f"console: {page.name} median < {TARGET_MS} ms",
                "value": page.median_ms,
                "floor": TARGET_MS,
                "holds": page.median_ms < TARGET_MS,
            }
        )
    return figures, floors


def format_table(results: dict) -> str:
    target = f"< {TARGET_MS} ms"
    header = f"{'page':<22} {'median ms':>10} {'p95 ms':>8}  {target:<8} {'SQL':>4} {'slowest SQL ms':>15}"
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
            f"{'yes' if page['under_target'] else 'NO':<8} {page['queries'] or '':>4} {slowest:>15}"
        )
    all_visible = results.get("environment", {}).get("all_visible_pages") or {}
    if all_visible:
        shares = ", ".join(f"{table} {share:.0%}" for table, share in sorted(all_visible.items()))
        lines.append(f"pages all-visible (index-only scans skip the table there): {shares}")
    if results.get("seed_seconds") is not None:
        lines.append(f"seeding took {results['seed_seconds']:.0f} s")
    return "\n".join(lines)


PART = Part(
    name="console",
    run=run,
    format_table=format_table,
    options=OPTIONS,
    default_output=DEFAULT_OUTPUT,
    doc=__doc__,
    keep_help="keep the database, and reuse it if already seeded",
)

if __name__ == "__main__":
    if sys.argv[1:2] == ["--count-queries"]:  # the child of _count_queries
        _count_queries_child(sys.argv[2:])
    else:
        sys.exit(PART.main())
