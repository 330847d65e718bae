"""`make bench`: the engine part (scripts/bench_engine.py), then the console part (scripts/bench_console.py).

Prints both tables and writes ``var/bench/latest.json``:
``{"floors": [{"name", "value", "floor", "holds"}], "figures": {name: {"value", "unit"}}}`` with the figures
of both parts. Floors are reported, never enforced: the exit status is non-zero only when a part crashed.

The console part's own options (``--tasks``, ``--dlq-items``, ``--database``, ``--requests``, ``--redis-url``)
pass through unchanged; the engine part's are the same as bench_engine.py's with an ``engine-`` prefix
(``--engine-jobs``, ``--engine-one-step-tasks``, ...). ``--keep`` and ``--server-url`` apply to both.
Example: ``make bench BENCH_ARGS="--skip-console"``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_console
import bench_engine

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "var" / "bench" / "latest.json"


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-engine", action="store_true", help="run only the console part")
    parser.add_argument("--skip-console", action="store_true", help="run only the engine part")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases (the console's is reused)")
    parser.add_argument("--server-url", default=bench_console.DEFAULT_SERVER_URL, help="PostgreSQL server")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    console = parser.add_argument_group("console part (as scripts/bench_console.py)")
    console.add_argument("--tasks", type=int, default=5_000_000)
    console.add_argument("--dlq-items", type=int, default=1_000_000)
    console.add_argument("--database", default="rc_bench", help="the console's database (default rc_bench)")
    console.add_argument("--requests", type=int, default=10, help="timed requests per page (default 10)")
    console.add_argument("--redis-url", default=bench_console.DEFAULT_REDIS_URL, help="the console's Redis")
    bench_engine.add_arguments(parser.add_argument_group("engine part (as scripts/bench_engine.py)"), "engine-")
    options = parser.parse_args(argv)
    if options.skip_engine and options.skip_console:
        parser.error("nothing to run: --skip-engine and --skip-console")
    for name in ("tasks", "dlq_items", "requests"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")

    figures: dict[str, dict] = {}
    floors: list[dict] = []
    tables: list[str] = []
    failed = False
    if not options.skip_engine:
        try:
            engine = bench_engine.run_from_options(options, "engine-", keep=options.keep, server_url=options.server_url)
        except bench_engine.BenchError as exc:
            print(f"bench: engine part: {exc}", file=sys.stderr)
            failed = True
        else:
            figures.update(engine["figures"])
            floors.extend(engine["floors"])
            tables.append(bench_engine.format_table(engine))
    if not options.skip_console:
        try:
            console = bench_console.run(
                tasks=options.tasks,
                dlq_items=options.dlq_items,
                database=options.database,
                keep=options.keep,
                requests_per_page=options.requests,
                server_url=options.server_url,
                redis_url=options.redis_url,
            )
        except bench_console.BenchError as exc:
            print(f"bench: console part: {exc}", file=sys.stderr)
            failed = True
        else:
            console_figures, console_floors = console_summary(console)
            figures.update(console_figures)
            floors.extend(console_floors)
            tables.append(bench_console.format_table(console))

    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps({"floors": floors, "figures": figures}, indent=2) + "\n")
    for table in tables:
        print()
        print(table)
    print(f"\nwritten to {options.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
