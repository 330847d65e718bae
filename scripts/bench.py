"""`make bench`: the engine, API, memory, recovery, backlog, priorities, purge and console parts, one after another.

- engine (scripts/bench_engine.py): throughput against bare RQ and raw PostgreSQL commits;
- API (scripts/bench_api.py): ``POST /api/v1/tasks`` requests/s and p50 / p99 latency through gunicorn, without
  and with idempotency keys, and replays;
- memory (scripts/bench_memory.py): a worker's RSS and peak RSS while it drains 10,000 tasks;
- recovery (scripts/bench_recovery.py): from SIGKILL of a worker in mid-step to the step's next attempt starting
  in another worker, with the default and with a short lease;
- backlog (scripts/bench_backlog.py): one sweep's time with no task and with 100,000 tasks queued, one job lost;
- priorities (scripts/bench_priorities.py): how long a critical task waits (median, max) behind 5,000 queued bulk
  tasks and 2 workers, against one bulk task's run time measured in the same run;
- purge (scripts/bench_purge.py): the retention purge of 1,000,000 finished tasks, its rate, and 2 workers'
  10-step throughput while it runs as a ratio of their throughput without it;
- console (scripts/bench_console.py): the operator pages on millions of rows.

Prints every table and writes ``var/bench/latest.json``:
``{"floors": [{"name", "value", "floor", "holds"}], "figures": {name: {"value", "unit"}}}`` with the figures
of all parts run. Floors are reported, never enforced: the exit status is non-zero only when a part crashed.
``--skip-engine``, ``--skip-api``, ``--skip-memory``, ``--skip-recovery``, ``--skip-backlog``,
``--skip-priorities``, ``--skip-purge`` and ``--skip-console`` leave a part out.

The console part's own options (``--tasks``, ``--dlq-items``, ``--database``, ``--requests``, ``--redis-url``)
pass through unchanged; each other part's are the same as its script's with a prefix: ``--engine-jobs``,
``--api-requests``, ``--memory-tasks``, ``--recovery-samples``, ``--backlog-tasks``, ``--priorities-tasks``,
``--purge-tasks``, ...
``--keep`` and ``--server-url`` apply to all.
Example: ``make bench BENCH_ARGS="--skip-console --skip-engine --recovery-settings short"``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_api
import bench_backlog
import bench_console
import bench_engine
import bench_memory
import bench_priorities
import bench_purge
import bench_recovery
from bench_part import write_results
from bench_processes import BENCH_DIR, DEFAULT_SERVER_URL, BenchError, exit_on_sigterm

DEFAULT_OUTPUT = BENCH_DIR / "latest.json"
# The parts in the order they run, each with the prefix of its options here: the console's keep their names.
PARTS = (
    (bench_engine.PART, "engine-"),
    (bench_api.PART, "api-"),
    (bench_memory.PART, "memory-"),
    (bench_recovery.PART, "recovery-"),
    (bench_backlog.PART, "backlog-"),
    (bench_priorities.PART, "priorities-"),
    (bench_purge.PART, "purge-"),
    (bench_console.PART, ""),
)


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for part, _ in PARTS:
        parser.add_argument(f"--skip-{part.name.lower()}", action="store_true", help=f"leave out the {part.name} part")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases (the console's is reused)")
    parser.add_argument("--server-url", default=DEFAULT_SERVER_URL, help="PostgreSQL server")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    for part, prefix in PARTS:
        part.add_arguments(parser.add_argument_group(f"{part.name} part (as scripts/{part.run.__module__}.py)"), prefix)
    options = parser.parse_args(argv)
    selected = [(part, prefix) for part, prefix in PARTS if not getattr(options, f"skip_{part.name.lower()}")]
    if not selected:
        parser.error("nothing to run: every part is skipped")

    figures: dict[str, dict] = {}
    floors: list[dict] = []
    tables: list[str] = []
    failed = False
    for part, prefix in selected:
        try:
            results = part.run_from_options(options, prefix, keep=options.keep, server_url=options.server_url)
        except BenchError as exc:
            print(f"bench: {part.name} part: {exc}", file=sys.stderr)
            failed = True
            continue
        figures.update(results["figures"])
        floors.extend(results["floors"])
        tables.append(part.format_table(results))

    write_results(options.output, {"floors": floors, "figures": figures})
    for table in tables:
        print()
        print(table)
    print(f"\nwritten to {options.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
