"""`make bench-compare BASE=<rev>`: the engine's figures of this tree beside an earlier commit's, in one run.

What a change costs the engine: the 1-step, batch-submitted 1-step and 10-step drains of ``scripts/bench_engine.py``
(``bench_engine``: 2 ``manage.py rqworker`` processes by default), each run by the earlier commit's code ("before",
``--base``: a commit, a tag, a branch) and by this working tree's ("after"), in rounds that alternate (before then
after, then after then before, ...), so the machine's drift hits both alike. It reports each figure's medians, the
ratio after/before and whether it is within ``--tolerance`` (5 %) of before. A benchmark, not a test: the exit
status is non-zero only when something crashed.

The earlier commit's files are taken with ``git archive`` into ``var/bench/trees/<commit>/`` (kept for the next
run); its workers and its submissions run there (``manage.py`` and the packages of that tree come first on their
path), with this environment's packages. Both run against one database migrated by this tree: a base commit with
fewer migrations runs on a schema it does not know the last columns of, as a rolling deploy's old workers do.
Results go to ``var/bench/compare.json``.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_db import database_url, drop_database
from bench_engine import bench_engine
from bench_part import REDIS_URL_OPTION, Option, Part, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ROOT,
    BenchError,
    check_database_name,
    create_migrated_database,
    log_directory,
    project_env,
)

DEFAULT_OUTPUT = BENCH_DIR / "compare.json"
TREES = BENCH_DIR / "trees"
# (figure, pipeline, submitted in batches, steps per task): the figures a change must not slow.
KINDS = (
    ("engine_1step_2w", "bench_noop_1", False, 1),
    ("engine_1step_batch_2w", "bench_noop_1", True, 1),
    ("engine_10step_2w", "bench_noop_10", False, 10),
)


def unit(steps: int) -> str:
    """A drain's figure: tasks/s, or for tasks of several steps, steps/s."""
    return "steps/s" if steps > 1 else "tasks/s"


OPTIONS = (
    Option("base", default="HEAD", help="the earlier commit (default HEAD: the change not yet committed)"),
    Option("rounds", type=positive_int, default=5, help="alternating rounds (default 5)"),
    Option("one_step_tasks", type=positive_int, default=2000, help="1-step tasks per drain"),
    Option("ten_step_tasks", type=positive_int, default=1000, help="10-step tasks per drain"),
    Option("workers", type=positive_int, default=2, help="worker processes per drain"),
    Option("tolerance", type=float, default=0.05, help="the share a figure may lose (default 0.05)"),
    Option("database", default="rc_bench_compare", help="the bench database"),
    REDIS_URL_OPTION,
)


def base_tree(rev: str) -> tuple[str, Path]:
    """The commit ``rev`` names and a folder holding its files (made once with ``git archive``)."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if found.returncode != 0:
        raise BenchError(f"no commit {rev!r} in {ROOT}")
    commit = found.stdout.strip()
    tree = TREES / commit
    if not (tree / "manage.py").exists():
        partial = TREES / f"{commit}.partial"
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted extraction left
        partial.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(partial)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise BenchError(f"git archive {commit} failed")
        partial.rename(tree)
    if not (tree / "scripts" / "bench_processes.py").exists():
        raise BenchError(f"commit {commit[:12]} has no scripts/bench_processes.py to submit its tasks with")
    return commit, tree


def run(
    *,
    base: str = "HEAD",
    rounds: int = 5,
    one_step_tasks: int = 2000,
    ten_step_tasks: int = 1000,
    workers: int = 2,
    tolerance: float = 0.05,
    database: str = "rc_bench_compare",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Drain each kind with the base commit's code and with this tree's, ``rounds`` times alternating; the medians."""
    check_database_name(database)
    commit, tree = base_tree(base)
    trees = {"before": tree, "after": ROOT}
    log_dir = log_directory(output)
    url = database_url(server_url, database)
    started = time.monotonic()
    samples: dict[str, dict[str, list[float]]] = {name: {"before": [], "after": []} for name, *_ in KINDS}
    try:
        progress(f"bench: comparing {commit[:12]} (before) with this tree (after), {rounds} rounds")
        create_migrated_database(server_url, database, project_env(url, redis_url))
        for number in range(rounds):
            order = ("before", "after") if number % 2 == 0 else ("after", "before")
            for name, pipeline, in_batches, steps in KINDS:
                count = ten_step_tasks if steps > 1 else one_step_tasks
                for side in order:
                    rate = bench_engine(
                        url, redis_url, pipeline, workers, count, log_dir, in_batches=in_batches, root=trees[side]
                    )
                    samples[name][side].append(rate * steps)
                    progress(f"bench: round {number + 1}: {name} {side}: {rate * steps:,.1f} {unit(steps)}")
    finally:
        if not keep:
            drop_database(server_url, database)
    rows, figures, floors = [], {}, []
    for name, _, _, steps in KINDS:
        before, after = (statistics.median(samples[name][side]) for side in ("before", "after"))
        ratio = after / before if before else 0.0
        holds = ratio >= 1 - tolerance
        rows.append(
            {
                "name": name,
                "unit": unit(steps),
                "before": round(before, 1),
                "after": round(after, 1),
                "ratio": round(ratio, 3),
                "holds": holds,
                "samples": {side: [round(value, 1) for value in samples[name][side]] for side in samples[name]},
            }
        )
        figures[f"compare.{name}.before"] = {"value": round(before, 1), "unit": unit(steps)}
        figures[f"compare.{name}.after"] = {"value": round(after, 1), "unit": unit(steps)}
        floors.append(
            {
                "name": f"{name} after >= {1 - tolerance:.0%} of before",
                "value": round(after, 1),
                "floor": round(before * (1 - tolerance), 1),
                "holds": holds,
            }
        )
    results = {
        "base": commit,
        "rows": rows,
        "figures": figures,
        "floors": floors,
        "sizes": {
            "rounds": rounds,
            "one_step_tasks": one_step_tasks,
            "ten_step_tasks": ten_step_tasks,
            "workers": workers,
            "tolerance": tolerance,
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    write_results(output, results)
    return results


def format_table(results: dict) -> str:
    lines = [
        f"Before ({results['base'][:12]}) and after (this tree), medians of {results['sizes']['rounds']} alternating"
        f" rounds, {results['sizes']['workers']} workers",
        f"{'figure':<24} {'before':>10} {'after':>10} {'after/before':>13}  within {results['sizes']['tolerance']:.0%}",
    ]
    for row in results["rows"]:
        lines.append(
            f"{row['name']:<24} {row['before']:>10,.1f} {row['after']:>10,.1f} {row['ratio']:>13.3f}"
            f"  {'yes' if row['holds'] else 'NO'}   ({row['unit']})"
        )
    lines.append(f"({results['seconds']:,.0f} s)")
    return "\n".join(lines)


PART = Part(
    name="compare",
    run=run,
    format_table=format_table,
    options=OPTIONS,
    default_output=DEFAULT_OUTPUT,
    doc=__doc__,
)


if __name__ == "__main__":
    sys.exit(PART.main())
