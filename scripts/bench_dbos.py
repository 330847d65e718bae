"""`make bench` (engine part): DBOS's 10-step workflows, steps/s: a durable-step peer beside the raw commits.

The raw commit rate follows the machine's disk, the engine's 10-step rate its CPU (docs/performance.md, "A
machine with a fast disk"): a peer that checkpoints every step in PostgreSQL too is measured in the same run,
reported beside them, and bound by no floor. DBOS (with SQLAlchemy and psycopg 3) lives in a venv of its own,
``var/bench-venvs/dbos``, built on first use from pyproject's ``dbos-baseline`` extra. Each of ``processes``
processes launches DBOS on a fresh database as its own executor and calls a workflow of 10 no-op steps in a
loop (in the process: no queue, DBOS's quickest way); the clock runs from when every process is warm and told
to start until the last one is done.
"""

from __future__ import annotations

import select
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench_db import database_url, drop_database, recreate_database
from bench_processes import SCRIPTS, WORKER_START_TIMEOUT, BenchError, baseline_venv

EXTRA = "dbos-baseline"
APP = SCRIPTS / "bench_dbos_app.py"
DRAIN_TIMEOUT = 600


def bench_dbos(
    server_url: str,
    database: str,
    processes: int,
    workflows: int,
    log_dir: Path,
    progress: Callable[[str], None] = print,
) -> float:
    """Steps/s of ``processes`` processes each running ``workflows`` 10-step DBOS workflows, on a fresh
    ``database``."""
    python = str(baseline_venv("dbos", EXTRA, progress))
    recreate_database(server_url, database)
    url = database_url(server_url, database)
    # DBOS's URL names its driver; psycopg 3 is the one in its venv.
    dbos_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    log_path = log_dir / "dbos.log"
    try:
        with open(log_path, "ab") as log:
            subprocess.run(
                [python, str(APP), "setup", dbos_url], stdout=log, stderr=log, check=True, timeout=WORKER_START_TIMEOUT
            )
            children = [
                subprocess.Popen(
                    [python, str(APP), "run", dbos_url, str(workflows), f"rc-bench-{index}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
                for index in range(processes)
            ]
            try:
                for child in children:
                    _expect(child, "ready", log_path, WORKER_START_TIMEOUT)
                for child in children:
                    child.stdin.write("go\n")
                    child.stdin.flush()
                spans = [_expect(child, "span", log_path, DRAIN_TIMEOUT) for child in children]
                for child in children:
                    try:
                        child.wait(timeout=DRAIN_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        raise BenchError(
                            f"a DBOS process did not exit within {DRAIN_TIMEOUT}s of its span; see {log_path}"
                        ) from None
            finally:
                for child in children:
                    if child.poll() is None:
                        child.kill()
                        child.wait()
        starts, ends, steps = zip(*((float(start), float(end), int(ran)) for _, start, end, ran in spans), strict=True)
        return sum(steps) / (max(ends) - min(starts))
    except subprocess.CalledProcessError as exc:
        raise BenchError(f"DBOS's setup failed ({exc.returncode}); see {log_path}") from None
    except subprocess.TimeoutExpired:
        # Only the setup's: a process's wait after its span says its own line above.
        raise BenchError(f"DBOS's setup took over {WORKER_START_TIMEOUT}s; see {log_path}") from None
    finally:
        drop_database(server_url, database)


def _expect(child: subprocess.Popen, word: str, log_path: Path, timeout: float) -> list[str]:
    """The child's next line, split; a BenchError when it is not ``word ...`` within ``timeout`` seconds (the child
    died, failed or hangs). Each child writes one line at a time and waits: nothing sits in the pipe's buffer."""
    readable, _, _ = select.select([child.stdout], [], [], timeout)
    if not readable:
        raise BenchError(f"a DBOS process said nothing within {timeout:.0f}s where {word!r} was due; see {log_path}")
    line = child.stdout.readline().split()
    if not line:
        raise BenchError(f"a DBOS process ended before it said {word!r}; see {log_path}")
    if line[0] != word:
        raise BenchError(f"a DBOS process answered {' '.join(line)!r} where {word!r} was due; see {log_path}")
    return line
