"""The short chaos campaign: `make chaos` in about two minutes, as a user would run it.

Every fault kind is injected (platform 5xx, 429, slow answers and 402s; SIGKILL and SIGSTOP of workers;
a Redis restart and a FLUSHALL; pg_terminate_backend) while tasks are submitted over HTTP, some of them
to the limited pipeline (max_concurrency 2, 10/s), which is paused and resumed once, and some cancelled by
their client (queued, mid-step, waiting for a retry, repeated, finished); the command must settle, print
the table and exit 0 with every invariant holding. A second run does the same in the
production topology: every connection through PgBouncer in transaction mode, Redis under Sentinel with a
failover of the primary, and PostgreSQL restarted (a cluster of the campaign's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from chaos.control_invariants import control_summary
from chaos.invariants import check

ROOT = Path(__file__).resolve().parent.parent.parent
FAULTS = ("sigkill", "sigstop", "redis-restart", "redis-flush", "pg-terminate")
TOPOLOGY_FAULTS = ("redis-failover", "pg-restart")

pytestmark = pytest.mark.acceptance


def server_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    if not parts.scheme.startswith("postgres"):
        pytest.fail("the chaos campaign needs PostgreSQL: set DATABASE_URL=postgresql://…")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def run_campaign(output_dir: Path, *args: str) -> tuple[str, Path, dict]:
    """``python -m chaos`` with ``args``, which must exit 0: its output, its run's directory and record."""
    argv = [sys.executable, "-m", "chaos", "--workers=4", f"--output-dir={output_dir}", *args]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    (run_dir,) = output_dir.iterdir()
    return output, run_dir, json.loads((run_dir / "record.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_campaign_injects_every_fault_and_every_invariant_holds(tmp_path):
    output, _, record = run_campaign(
        tmp_path,
        "--tasks=200",
        "--duration=75",
        "--seed=11",
        "--cancel-share=0.15",  # some 30 cancels: enough to meet tasks in every situation
        f"--server-url={server_url()}",
        f"--database=test_chaos_{os.getpid()}",
    )
    injected = {fault["kind"] for fault in record["faults"] if not fault.get("failed")}
    assert injected >= set(FAULTS), output[-3000:]
    assert any(call["fault"] == "503" for call in record["calls"])
    assert any(call["status"] == 429 for call in record["calls"])
    assert any(call["status"] == 402 for call in record["calls"])
    accepted = [s for s in record["submissions"] if s["status"] in (200, 201)]
    assert len({s["task_id"] for s in accepted}) >= 190
    assert any(s["replayed"] for s in accepted), "no concurrent duplicate was answered with the original task"
    # Batches: their tasks ran as batch deliveries (several per RQ job) under the same faults and invariants.
    assert sum(1 for s in accepted if s.get("batch") is not None) >= 10, "too few batched submissions accepted"
    assert {t["state"] for t in record["tasks"]} >= {"succeeded", "compensated", "cancelled"}

    # Live control: the limited pipeline ran, was held back by its concurrency limit and by the pause; cancels
    # were accepted, refused for finished tasks, and repeated.
    limited = [t for t in record["tasks"] if t["pipeline"] == "report_limited"]
    assert len(limited) >= 20 and any(t["state"] == "succeeded" for t in limited)
    # Its rate (10/s) binds only in bursts, which a short run may not have; the pause and the slots always do.
    assert {"paused", "concurrency"} <= set(record["meta"]["holds"]["report_limited"]), output[-3000:]
    assert [c["action"] for c in record["controls"] if not c.get("failed")] == ["pause", "resume"]
    answers = {c["status"] for c in record["cancels"]}
    assert {409} <= answers and answers & {200, 202}, answers
    assert any(c["repeat"] and c["status"] in (200, 202) for c in record["cancels"])
    found = dict(control_summary(record))
    assert found.get("cancel found the task before its first step") and found.get("cancel found the task mid-step")

    # Waits: approval tasks were decided by signals (kept, replayed, refused) and passed their wait and sleep;
    # the schedule fired its slots under the faults and was paused.
    approvals = [t for t in record["tasks"] if t["pipeline"] == "report_approved"]
    assert len(approvals) >= 10 and any(t["state"] == "succeeded" for t in approvals)
    assert any(s["status"] == 202 for s in record["signals_sent"])
    assert {c["step_name"] for c in record["wait_checkpoints"]} == {"manager_approval", "cool_off"}
    assert found.get("slots of chaos-tick fired", 0) >= 10, output[-3000:]
    assert [c["action"] for c in record["schedule_controls"] if not c.get("failed")] == ["pause"]

    # Re-checking the record agrees with the printed table: every invariant with PASS.
    results = check(record)
    assert len(results) == 20
    for result in results:
        assert result.holds, result.violations[:5]
        assert any(result.name in line and "PASS" in line for line in output.splitlines()), output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_campaign_through_pgbouncer_with_a_sentinel_failover_and_a_postgres_restart(tmp_path):
    output, run_dir, record = run_campaign(
        tmp_path,
        "--tasks=150",
        "--duration=60",
        "--seed=12",
        "--pgbouncer",
        "--sentinel",
        "--own-cluster",
        f"--database=test_chaos_topo_{os.getpid()}",
    )
    injected = {fault["kind"] for fault in record["faults"] if not fault.get("failed")}
    assert injected >= set(FAULTS) | set(TOPOLOGY_FAULTS), output[-3000:]
    assert record["meta"]["faults_injected"]["redis-failover"] == 1
    assert record["meta"]["faults_injected"]["pg-restart"] == 1
    topology = record["meta"]["topology"]
    assert topology["pooler"].startswith("pgbouncer") and topology["redis"].startswith("sentinel")
    assert topology["postgresql"].startswith("own cluster")
    assert "topology: postgresql own cluster" in output
    # Every process reached PostgreSQL through PgBouncer: it logged their logins to the campaign's database.
    (pgbouncer_log,) = (run_dir / "logs").glob("pgbouncer-*.log")
    assert f"db=test_chaos_topo_{os.getpid()}" in pgbouncer_log.read_text()
    # The throwaway cluster was deleted with the run.
    assert not Path(topology["postgresql"].rsplit(" in ", 1)[1]).exists()
    accepted = [s for s in record["submissions"] if s["status"] in (200, 201)]
    assert len({s["task_id"] for s in accepted}) >= 140
    results = check(record)
    for result in results:
        assert result.holds, result.violations[:5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks=0"], "--tasks must be at least 1"),
        (["--workers=1"], "SIGKILL faults need at least 2 workers"),
        (["--database=x;drop"], "--database must be letters"),
        (["--faults=redis-failover"], "the fault redis-failover needs --sentinel"),
        (["--faults=pg-restart,sigkill", "--pgbouncer"], "the fault pg-restart needs --own-cluster"),
        (["--own-cluster", "--server-url=postgresql://postgres@127.0.0.1:5432"], "leave out --server-url"),
        (["--cancel-share=1.5"], "--cancel-share must be between 0 and 1"),
        (["--duration=60", "--pause-seconds=30"], "--pause-seconds must be between 0 and 40% of --duration"),
        (["--limited-share=0", "--pause-seconds=5"], "--pause-seconds pauses the limited pipeline"),
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
