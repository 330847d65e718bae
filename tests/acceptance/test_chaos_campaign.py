"""The short chaos campaign: `make chaos` in about two minutes, as a user would run it.

Every fault kind is injected (platform 5xx, 429, slow answers and 402s; SIGKILL and SIGSTOP of workers;
a Redis restart and a FLUSHALL; pg_terminate_backend) while tasks are submitted over HTTP; the command
must settle, print the table and exit 0 with every invariant holding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from chaos.invariants import check

ROOT = Path(__file__).resolve().parent.parent.parent
FAULTS = ("sigkill", "sigstop", "redis-restart", "redis-flush", "pg-terminate")

pytestmark = pytest.mark.acceptance


def server_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    if not parts.scheme.startswith("postgres"):
        pytest.fail("the chaos campaign needs PostgreSQL: set DATABASE_URL=postgresql://…")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


@pytest.mark.timeout(600)
def test_short_campaign_injects_every_fault_and_every_invariant_holds(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "chaos",
        "--tasks=200",
        "--workers=4",
        "--duration=75",
        "--seed=11",
        f"--server-url={server_url()}",
        f"--database=test_chaos_{os.getpid()}",
        f"--output-dir={tmp_path}",
    ]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]

    (run_dir,) = tmp_path.iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    injected = {fault["kind"] for fault in record["faults"] if not fault.get("failed")}
    assert injected >= set(FAULTS), output[-3000:]
    assert any(call["fault"] == "503" for call in record["calls"])
    assert any(call["status"] == 429 for call in record["calls"])
    assert any(call["status"] == 402 for call in record["calls"])
    accepted = [s for s in record["submissions"] if s["status"] in (200, 201)]
    assert len({s["task_id"] for s in accepted}) >= 190
    assert any(s["replayed"] for s in accepted), "no concurrent duplicate was answered with the original task"
    assert {t["state"] for t in record["tasks"]} >= {"succeeded", "compensated"}

    # Re-checking the record agrees with the printed table: every invariant with PASS.
    results = check(record)
    assert len(results) == 9
    for result in results:
        assert result.holds, result.violations[:5]
        assert any(result.name in line and "PASS" in line for line in output.splitlines()), output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks=0"], "--tasks must be at least 1"),
        (["--workers=1"], "SIGKILL faults need at least 2 workers"),
        (["--database=x;drop"], "--database must be letters"),
    ],
)
def test_bad_options_exit_2_with_one_line_and_start_nothing(args, message, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "chaos", f"--output-dir={tmp_path}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_unknown_fault_is_refused_by_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "chaos", "--faults=sigkill,meteor"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "unknown fault meteor" in result.stderr
    assert "Traceback" not in result.stderr
