"""`make chaos`: a fault campaign against a real deployment on this machine; exit 1 on any broken invariant.

Example: ``make chaos CHAOS_ARGS="--tasks 600 --workers 4 --duration 180 --seed 3"``; live control: a share of
tasks for a pipeline with limits (``--limited-share``), a share cancelled by their client (``--cancel-share``),
that pipeline paused once (``--pause-seconds``), a share of keyed tasks sent in batches (``--batch-share``);
waits: a share of tasks for a pipeline that waits for a manager's approval signal and sleeps (``--approval-share``);
production topologies:
``--pgbouncer`` (every connection through PgBouncer in transaction mode), ``--sentinel`` (Redis under Sentinel,
with the fault redis-failover), ``--own-cluster`` (a throwaway PostgreSQL cluster, with the fault pg-restart).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chaos.faults import ALL_FAULTS, TOPOLOGY_FAULTS
from chaos.workload import APPROVAL_SHARE, BATCH_SHARE

ROOT = Path(__file__).resolve().parent.parent


def parse_faults(value: str) -> frozenset[str] | None:
    """The faults named; None for ``all``: every fault that applies to the topology chosen."""
    if value == "all":
        return None
    if value == "none":
        return frozenset()
    chosen = frozenset(part.strip() for part in value.split(",") if part.strip())
    unknown = chosen - set(ALL_FAULTS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault {', '.join(sorted(unknown))}; choose from all, none or {', '.join(ALL_FAULTS)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks to submit (default 2000)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--duration", type=float, default=600, help="seconds of submissions and faults (default 600)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the plan and the fault schedule (default 1)")
    needs = ", ".join(f"{kind} needs {option}" for kind, option in TOPOLOGY_FAULTS.items())
    parser.add_argument(
        "--faults",
        type=parse_faults,
        default=None,
        help=f"all (default: every one that applies to the topology), none, or some of: {', '.join(ALL_FAULTS)} "
        f"({needs})",
    )
    parser.add_argument("--settle-timeout", type=float, default=300, help="seconds to wait for every task to finish")
    parser.add_argument(
        "--server-url", default=None, help="PostgreSQL server (default postgresql://postgres@127.0.0.1:5432)"
    )
    parser.add_argument(
        "--own-cluster",
        action="store_true",
        help="run a throwaway PostgreSQL cluster of the campaign's own (initdb, a free port) instead of --server-url",
    )
    parser.add_argument(
        "--pgbouncer", action="store_true", help="every connection of every process through a PgBouncer (transaction)"
    )
    parser.add_argument("--sentinel", action="store_true", help="Redis as a primary, one replica and three Sentinels")
    parser.add_argument("--database", default="rc_chaos", help="the campaign's database, created and dropped")
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="keep the database for inspection (with --own-cluster: the stopped cluster's directory)",
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "var" / "chaos", help="where runs are recorded")
    parser.add_argument("--lease-seconds", type=float, default=5.0, help="workers' lease (default 5)")
    parser.add_argument("--sweep-interval", type=float, default=1.0, help="sweeper interval (default 1)")
    parser.add_argument(
        "--limited-share",
        type=float,
        default=0.2,
        help="share of tasks sent to the limited pipeline report_limited (max_concurrency 2, 10/s; default 0.2)",
    )
    parser.add_argument(
        "--cancel-share", type=float, default=0.1, help="share of tasks their client cancels over the API (default 0.1)"
    )
    parser.add_argument(
        "--batch-share",
        type=float,
        default=BATCH_SHARE,
        help="share of keyed tasks sent in batches of up to 8 (POST /api/v1/tasks/batch; default %(default)s)",
    )
    parser.add_argument(
        "--approval-share",
        type=float,
        default=APPROVAL_SHARE,
        help="share of tasks (of those not sent to report_limited) for report_approved, which waits for a "
        "manager's signal, sent over the API by their client, then sleeps (default %(default)s)",
    )
    parser.add_argument(
        "--pause-seconds",
        type=float,
        default=None,
        help="how long report_limited is paused, once, mid-run (default 10%% of --duration, 5 to 30 s but at most "
        "40%%; 0: no pause)",
    )
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    from chaos.campaign import CampaignConfig, DeploymentError, report, run

    config = CampaignConfig(
        tasks=options.tasks,
        workers=options.workers,
        duration=options.duration,
        seed=options.seed,
        faults=options.faults,
        settle_timeout=options.settle_timeout,
        server_url=options.server_url,
        database=options.database,
        keep_database=options.keep_database,
        output_dir=options.output_dir,
        lease_seconds=options.lease_seconds,
        sweep_interval=options.sweep_interval,
        own_cluster=options.own_cluster,
        pgbouncer=options.pgbouncer,
        sentinel=options.sentinel,
        limited_share=options.limited_share,
        cancel_share=options.cancel_share,
        batch_share=options.batch_share,
        approval_share=options.approval_share,
        pause_seconds=options.pause_seconds,
    )
    try:
        config.validate()
    except ValueError as exc:
        print(f"make chaos: {exc}", file=sys.stderr)
        return 2
    try:
        result = run(config, progress=lambda line: print(line, flush=True))
    except DeploymentError as exc:
        print(f"make chaos: the deployment failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("make chaos: interrupted; everything it started was stopped", file=sys.stderr)
        return 130
    print(report(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
