"""`make bench`: the engine, API, memory, recovery and console parts, one after the other.

- engine (scripts/bench_engine.py): throughput against bare RQ and raw PostgreSQL commits;
- API (scripts/bench_api.py): ``POST /api/v1/tasks`` requests/s and p50 / p99 latency through gunicorn, without
  and with idempotency keys, and replays;
- memory (scripts/bench_memory.py): a worker's RSS and peak RSS while it drains 10,000 tasks;
- recovery (scripts/bench_recovery.py): from SIGKILL of a worker in mid-step to the step's next attempt starting
  in another worker, with the default and with a short lease;
- console (scripts/bench_console.py): the operator pages on millions of rows.

Prints every table and writes ``var/bench/latest.json``:
``{"floors": [{"name", "value", "floor", "holds"}], "figures": {name: {"value", "unit"}}}`` with the figures
of all parts run. Floors are reported, never enforced: the exit status is non-zero only when a part crashed.
``--skip-engine``, ``--skip-api``, ``--skip-memory``, ``--skip-recovery`` and ``--skip-console`` leave a part out.

The console part's own options (``--tasks``, ``--dlq-items``, ``--database``, ``--requests``, ``--redis-url``)
pass through unchanged; each other part's are the same as its script's with a prefix: ``--engine-jobs``,
``--api-requests``, ``--memory-tasks``, ``--recovery-samples``, ... ``--keep`` and ``--server-url`` apply to all.
Example: ``make bench BENCH_ARGS="--skip-console --skip-engine --recovery-settings short"``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_api
import bench_console
import bench_engine
import bench_memory
import bench_recovery
from bench_processes import exit_on_sigterm

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "var" / "bench" / "latest.json"
# The parts in the order they run (the console last); each takes its script's options with a prefix.
PARTS = (
    ("engine", bench_engine, "engine-"),
    ("API", bench_api, "api-"),
    ("memory", bench_memory, "memory-"),
    ("recovery", bench_recovery, "recovery-"),
)


def console_summary(results: dict) -> tuple[dict, list[dict]]:
    figures, floors = {}, []
    for page in results["pages"]:
        figures[f"console.{page['name']}.median"] = {"value": page["median_ms"], "unit": "ms"}
        figures[f"console.{page['name']}.p95"] = {"value": page["p95_ms"], "unit": "ms"}
        floors.append(
            {
                "name": f"console: {page['name']} median < {bench_console.TARGET_MS} ms",
                "value": page["median_ms"],
                "floor": bench_console.TARGET_MS,
                "holds": page["median_ms"] < bench_console.TARGET_MS,
            }
        )
    return figures, floors


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, _, _ in PARTS:
        parser.add_argument(f"--skip-{name.lower()}", action="store_true", help=f"leave out the {name} part")
    parser.add_argument("--skip-console", action="store_true", help="leave out the console part")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases (the console's is reused)")
    parser.add_argument("--server-url", default=bench_console.DEFAULT_SERVER_URL, help="PostgreSQL server")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    console = parser.add_argument_group("console part (as scripts/bench_console.py)")
    console.add_argument("--tasks", type=int, default=5_000_000)
    console.add_argument("--dlq-items", type=int, default=1_000_000)
    console.add_argument("--database", default="rc_bench", help="the console's database (default rc_bench)")
    console.add_argument("--requests", type=int, default=10, help="timed requests per page (default 10)")
    console.add_argument("--redis-url", default=bench_console.DEFAULT_REDIS_URL, help="the console's Redis")
    for name, module, prefix in PARTS:
        module.add_arguments(parser.add_argument_group(f"{name} part (as scripts/{module.__name__}.py)"), prefix)
    options = parser.parse_args(argv)
    for name in ("tasks", "dlq_items", "requests"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")

    common = {"keep": options.keep, "server_url": options.server_url}
    parts = [
        (name, module, functools.partial(module.run_from_options, options, prefix, **common))
        for name, module, prefix in PARTS
        if not getattr(options, f"skip_{name.lower()}")
    ]
    if not options.skip_console:
        parts.append(("console", bench_console, functools.partial(_run_console, options)))
    if not parts:
        parser.error("nothing to run: every part is skipped")

    figures: dict[str, dict] = {}
    floors: list[dict] = []
    tables: list[str] = []
    failed = False
    for name, module, run_part in parts:
        try:
            results = run_part()
        except module.BenchError as exc:
            print(f"bench: {name} part: {exc}", file=sys.stderr)
            failed = True
            continue
        figures.update(results["figures"])
        floors.extend(results["floors"])
        tables.append(module.format_table(results))

    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps({"floors": floors, "figures": figures}, indent=2) + "\n")
    for table in tables:
        print()
        print(table)
    print(f"\nwritten to {options.output}")
    return 1 if failed else 0


def _run_console(options: argparse.Namespace) -> dict:
    results = bench_console.run(
        tasks=options.tasks,
        dlq_items=options.dlq_items,
        database=options.database,
        keep=options.keep,
        requests_per_page=options.requests,
        server_url=options.server_url,
        redis_url=options.redis_url,
    )
    results["figures"], results["floors"] = console_summary(results)
    return results


if __name__ == "__main__":
    sys.exit(main())
