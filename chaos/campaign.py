"""One chaos campaign: deploy, submit (and cancel, and pause) under faults, settle, record, check.

``run(config)`` returns the recorded run (see ``chaos.record``) and the invariant results; it
writes ``record.json``, ``report.txt`` and every process's log under the run's directory. The plan
(what is submitted when, to which pipeline, with which key, user and deadline, which tasks are
cancelled at which moment), the fault schedule (which fault when, which worker by its place in the
pool), the pause and the simulator's fault draws all follow from the seed; the interleaving of real
processes does not, so two runs of one seed inject the same faults into slightly different moments
of the work.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from chaos import faults as fault_module
from chaos import invariants
from chaos.controls import MAX_PAUSE_SHARE, PipelineOperator, default_pause_seconds, pause_plan
from chaos.deployment import Deployment, DeploymentSettings
from chaos.processes import DeploymentError
from chaos.record import TERMINAL_STATES
from chaos.schedules import TICK_SCHEDULE, pause_tick
from chaos.signals import APPROVAL_PIPELINE, Signaller
from chaos.workload import (
    APPROVAL_SHARE,
    BATCH_SHARE,
    LIMITED_PIPELINE,
    PLATFORM_PIPELINE,
    Canceller,
    Submitter,
    plan,
)

logger = logging.getLogger(__name__)

# The pipelines whose tasks act on the report platform; the limited and the approval one are the campaign's
# (chaos.pipelines).
PLATFORM_PIPELINES = (PLATFORM_PIPELINE, LIMITED_PIPELINE, APPROVAL_PIPELINE)
# Submissions and faults happen inside these shares of the duration; the rest lets retries play out.
SUBMIT_SHARE = 0.75
# Platform calls per task, roughly (four steps, retries, compensations): sizes the slow-answer rate.
CALLS_PER_TASK = 5.5
# Slow answers hold a worker for a whole step timeout: about one per this many seconds of the run.
SECONDS_PER_SLOW_ANSWER = 15
TOPOLOGY_FAULT_REASONS = {
    "redis-failover": "a replica for Sentinel to promote",
    "pg-restart": "the campaign restarts only a PostgreSQL cluster it started itself, never the machine's server",
}


@dataclass(frozen=True)
class CampaignConfig:
    tasks: int = 2000
    workers: int = 4
    duration: float = 600.0
    seed: int = 1
    # None: every fault the topology has the parts for (``faults.applicable_faults``).
    faults: frozenset[str] | None = None
    settle_timeout: float = 300.0
    server_url: str | None = None  # None: the machine's server (``deployment.DEFAULT_SERVER_URL``)
    database: str = "rc_chaos"
    lease_seconds: float = 5.0
    sweep_interval: float = 1.0
    redelivery_grace: float = 3.0
    output_dir: Path = Path("var/chaos")
    keep_database: bool = False
    own_cluster: bool = False
    pgbouncer: bool = False
    sentinel: bool = False
    # Live control: the share of tasks sent to the limited pipeline, the share their client cancels, and
    # how long the limited pipeline is paused (None: default_pause_seconds(duration), none without the
    # pipeline; 0: no pause).
    limited_share: float = 0.2
    cancel_share: float = 0.1
    pause_seconds: float | None = None
    # The share of keyed tasks sent in batches (POST /api/v1/tasks/batch): delivered several per RQ job.
    batch_share: float = BATCH_SHARE
    # The share of tasks (not sent to the limited pipeline) for the approval pipeline, decided by a signal.
    approval_share: float = APPROVAL_SHARE

    def __post_init__(self) -> None:
        if self.faults is None:
            applicable = fault_module.applicable_faults(sentinel=self.sentinel, own_cluster=self.own_cluster)
            object.__setattr__(self, "faults", frozenset(applicable))
        if self.pause_seconds is None:
            pause = default_pause_seconds(self.duration) if self.limited_share else 0.0
            object.__setattr__(self, "pause_seconds", pause)

    def validate(self) -> None:
        if self.tasks < 1:
            raise ValueError("--tasks must be at least 1")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")
        if self.duration < 10:
            raise ValueError("--duration must be at least 10 seconds")
        if "sigkill" in self.faults and self.workers < 2:
            raise ValueError("SIGKILL faults need at least 2 workers")
        unknown = self.faults - set(fault_module.ALL_FAULTS)
        if unknown:
            raise ValueError(
                f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(fault_module.ALL_FAULTS)})"
            )
        if not self.database.replace("_", "").isalnum():
            raise ValueError(f"--database must be letters, digits and _, got {self.database!r}")
        present = {"--sentinel": self.sentinel, "--own-cluster": self.own_cluster}
        for kind, option in fault_module.TOPOLOGY_FAULTS.items():
            if kind in self.faults and not present[option]:
                raise ValueError(f"the fault {kind} needs {option} ({TOPOLOGY_FAULT_REASONS[kind]})")
        if self.own_cluster and self.server_url is not None:
            raise ValueError("--own-cluster runs a PostgreSQL cluster of its own: leave out --server-url")
        shares = (
            ("--limited-share", self.limited_share),
            ("--cancel-share", self.cancel_share),
            ("--batch-share", self.batch_share),
            ("--approval-share", self.approval_share),
        )
        for option, share in shares:
            if not 0 <= share <= 1:
                raise ValueError(f"{option} must be between 0 and 1, got {share:g}")
        if not 0 <= self.pause_seconds <= MAX_PAUSE_SHARE * self.duration:
            raise ValueError(
                f"--pause-seconds must be between 0 and {MAX_PAUSE_SHARE:.0%} of --duration, got {self.pause_seconds:g}"
            )
        if self.pause_seconds and not self.limited_share:
            raise ValueError("--pause-seconds pauses the limited pipeline: give it a --limited-share (or pause 0)")


@dataclass
class CampaignResult:
    run_dir: Path
    record: dict
    results: list
    settled: bool
    seconds: float

    @property
    def passed(self) -> bool:
        return self.settled and all(result.holds for result in self.results)


def run(config: CampaignConfig, *, progress=print) -> CampaignResult:
    config.validate()
    run_dir = Path(config.output_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{config.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    window = config.duration * SUBMIT_SHARE
    pause = pause_plan(
        seed=config.seed, duration=config.duration, pipeline=LIMITED_PIPELINE, seconds=config.pause_seconds
    )
    planned, broke_users = plan(
        seed=config.seed,
        tasks=config.tasks,
        window=window,
        with_402="402" in config.faults,
        limited_share=config.limited_share,
        cancel_share=config.cancel_share,
        batch_share=config.batch_share,
        approval_share=config.approval_share,
        paused=(pause.at, pause.at + pause.seconds) if pause else None,
    )
    slow_rate = min(0.02, config.duration / SECONDS_PER_SLOW_ANSWER / (config.tasks * CALLS_PER_TASK))
    settings = DeploymentSettings(
        server_url=config.server_url,
        database=config.database,
        workers=config.workers,
        lease_seconds=config.lease_seconds,
        sweep_interval=config.sweep_interval,
        redelivery_grace=config.redelivery_grace,
        simulator_args=fault_module.simulator_args(
            faults=config.faults, seed=config.seed, slow_rate=slow_rate, broke_users=broke_users
        ),
        own_cluster=config.own_cluster,
        pgbouncer=config.pgbouncer,
        sentinel=config.sentinel,
    )
    deployment = Deployment(settings, run_dir)
    began = time.monotonic()
    try:
        topology = deployment.topology()
        progress(
            f"chaos: deploying ({config.workers} workers; PostgreSQL {topology['postgresql']}, "
            f"pooler {topology['pooler']}, Redis {topology['redis']}) in {run_dir}"
        )
        deployment.start()
        injector = fault_module.FaultInjector(deployment, seed=config.seed, lease_seconds=config.lease_seconds)
        scheduled = fault_module.schedule(seed=config.seed, faults=config.faults, window=config.duration)
        stop = threading.Event()
        canceller = Canceller(deployment.api_url, deployment.api_token, stop)
        signaller = Signaller(deployment.api_url, deployment.api_token, stop)
        submitter = Submitter(deployment.api_url, deployment.api_token, canceller=canceller, signaller=signaller)
        operator = PipelineOperator(workers_ready=deployment.pool.listening)
        cancels = sum(1 for task in planned if task.cancel is not None)
        limited = sum(1 for task in planned if task.pipeline == LIMITED_PIPELINE)
        approvals = sum(1 for task in planned if task.pipeline == APPROVAL_PIPELINE)
        progress(
            f"chaos: submitting {config.tasks} tasks over {window:.0f} s ({limited} to {LIMITED_PIPELINE}, "
            f"{approvals} to {APPROVAL_PIPELINE}, {cancels} to cancel) with {len(scheduled)} scheduled faults"
            + (f", {LIMITED_PIPELINE} paused at {pause.at:.0f} s for {pause.seconds:g} s" if pause else "")
            + f" (seed {config.seed})"
        )
        started = time.monotonic()
        threads = [
            threading.Thread(target=submitter.run, args=(planned, started, stop), name="submitter"),
            threading.Thread(target=injector.run, args=(scheduled, started, stop), name="faults"),
            threading.Thread(target=operator.run, args=(pause, started, stop), name="operator"),
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=1)
            canceller.wait()
            signaller.wait()
            # The submissions are done: the schedule stops, so that the run can settle.
            schedule_controls = [pause_tick()]
        except KeyboardInterrupt:
            stop.set()
            raise
        remaining = config.duration - (time.monotonic() - started)
        settled = _settle(config.settle_timeout + max(0.0, remaining), progress)
        deployment.stop_workers()  # no more platform calls: the simulator's record is final
        record = _record(config, deployment, submitter, canceller, injector, operator, signaller, schedule_controls)
    finally:
        deployment.stop(drop_database=not config.keep_database)
    results = invariants.check(record)
    result = CampaignResult(run_dir, record, results, settled, time.monotonic() - began)
    (run_dir / "record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    (run_dir / "report.txt").write_text(report(result) + "\n")
    return result


def _settle(timeout: float, progress) -> bool:
    """Wait until every task is in a terminal state; False when the time ran out."""
    from django.db import close_old_connections

    from tasks.models import Task

    deadline = time.monotonic() + timeout
    last_report = 0.0
    while True:
        close_old_connections()
        try:
            open_tasks = Task.objects.exclude(state__in=TERMINAL_STATES).count()
        except Exception as exc:  # the database may still be recovering from the injected faults
            progress(f"chaos: settle check failed ({type(exc).__name__}), trying again")
            open_tasks = -1
        if open_tasks == 0:
            return True
        now = time.monotonic()
        if now >= deadline:
            progress(f"chaos: {open_tasks} tasks still not terminal after {timeout:.0f} s")
            return False
        if now - last_report >= 15:
            progress(f"chaos: settling, {open_tasks} tasks not terminal yet")
            last_report = now
        time.sleep(1)


def _time(value) -> str | None:
    return value.isoformat() if value is not None else None


def _policy(pipeline) -> dict:
    """What the checker needs of a pipeline's declaration: retry budgets, compensated steps, limits."""
    rate = pipeline.rate_limit
    return {
        "steps": [step.name for step in pipeline.steps],
        "compensated_steps": [step.name for step in pipeline.steps if step.compensate is not None],
        "max_attempts": max(pipeline.retry_policy_for(step).max_attempts for step in pipeline.steps),
        "compensation_max_attempts": max(step.compensation_retry.max_attempts for step in pipeline.steps),
        "max_concurrency": pipeline.max_concurrency,
        "rate_limit": {"count": rate.count, "window_seconds": rate.window} if rate is not None else None,
        "on_cancel": str(pipeline.on_cancel),
        "waits": [step.name for step in pipeline.steps if step.wait is not None],
        "sleeps": [step.name for step in pipeline.steps if step.sleep is not None],
    }


def _holds(metrics_dir: Path) -> dict[str, dict[str, int]]:
    """How often each pipeline's tasks were held back, by why (the engine's counter, summed over every process)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    holds: dict[str, dict[str, int]] = {}
    for metric in registry.collect():
        if metric.name == "reliability_task_holds":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    by_hold = holds.setdefault(sample.labels["pipeline"], {})
                    by_hold[sample.labels["hold"]] = by_hold.get(sample.labels["hold"], 0) + int(sample.value)
    return holds


def _record(
    config,
    deployment: Deployment,
    submitter: Submitter,
    canceller: Canceller,
    injector,
    operator,
    signaller,
    schedule_controls: list[dict],
) -> dict:
    from django.conf import settings
    from django.db import close_old_connections

    from dlq.models import DLQItem
    from tasks import registry
    from tasks.demo.platform_simulator import SimulatorControl
    from tasks.models import Checkpoint, PipelineSchedule, ScheduleRun, SideEffect, Signal, StepAttempt, Task

    close_old_connections()
    control = SimulatorControl(deployment.simulator_url, timeout=60)
    tasks = [
        {
            **row,
            "id": str(row["id"]),
            "deadline": _time(row["deadline"]),
            "cancel_requested_at": _time(row["cancel_requested_at"]),
            "finished_at": _time(row["finished_at"]),
            "created_at": _time(row["created_at"]),
        }
        for row in Task.objects.values(
            "id",
            "pipeline",
            "state",
            "input",
            "generation",
            "idempotency_key",
            "failure_reason",
            "failure_code",
            "deadline",
            "cancel_requested_at",
            "cancel_requested_by",
            "finished_at",
            "created_at",
        )
    ]
    return {
        "meta": {
            "seed": config.seed,
            "tasks": config.tasks,
            "workers": config.workers,
            "duration": config.duration,
            "faults_enabled": sorted(config.faults),
            "faults_injected": dict(Counter(fault["kind"] for fault in injector.log if not fault.get("failed"))),
            "topology": deployment.topology(),
            "max_crashes": settings.RELIABILITY_MAX_CRASHES,
            "lease_seconds": config.lease_seconds,
            "worker_replacements": deployment.pool.replacements if deployment.pool else 0,
            "live_control": {
                "limited_share": config.limited_share,
                "cancel_share": config.cancel_share,
                "batch_share": config.batch_share,
                "approval_share": config.approval_share,
                "pause_seconds": config.pause_seconds,
            },
            "holds": _holds(deployment.metrics_dir),
            "platform_pipelines": list(PLATFORM_PIPELINES),
            "policies": {name: _policy(registry.get(name)) for name in PLATFORM_PIPELINES},
        },
        "faults": injector.log,
        "controls": operator.log,
        "submissions": submitter.records,
        "cancels": canceller.records,
        "tasks": tasks,
        "dlq_items": [
            {**row, "task_id": str(row["task_id"])}
            for row in DLQItem.objects.values("task_id", "status", "reason_code")
        ],
        "attempts": [
            {
                **row,
                "task_id": str(row["task_id"]),
                "started_at": _time(row["started_at"]),
                "finished_at": _time(row["finished_at"]),
            }
            for row in StepAttempt.objects.values(
                "task_id",
                "kind",
                "generation",
                "step_index",
                "step_name",
                "attempt",
                "outcome",
                "fencing_token",
                "worker",
                "started_at",
                "finished_at",
            )
        ],
        "ledger": [
            {**row, "task_id": str(row["task_id"])}
            for row in SideEffect.objects.values(
                "task_id", "generation", "step_name", "effect_name", "effect_key", "status"
            )
        ],
        "calls": control.calls(),
        "platform": control.state(),
        "signals_sent": signaller.records,
        "signals": [
            {**row, "task_id": str(row["task_id"]), "received_at": _time(row["received_at"])}
            for row in Signal.objects.values("task_id", "name", "payload", "received_at")
        ],
        "schedule_controls": schedule_controls,
        "schedules": [
            {
                **row,
                "created_at": _time(row["created_at"]),
                "last_slot_at": _time(row["last_slot_at"]),
                "paused_at": _time(row["paused_at"]),
            }
            for row in PipelineSchedule.objects.filter(name=TICK_SCHEDULE).values(
                "name", "every_seconds", "created_at", "last_slot_at", "paused_at", "slots_skipped", "slots_missed"
            )
        ],
        "schedule_runs": [
            {
                "schedule": row["schedule__name"],
                "slot_at": _time(row["slot_at"]),
                "task_id": str(row["task_id"]) if row["task_id"] is not None else None,
                "error": row["error"],
            }
            for row in ScheduleRun.objects.values("schedule__name", "slot_at", "task_id", "error")
        ],
        # The checkpoints of the steps that wait: what a signal brought, until when a sleep slept, and when.
        "wait_checkpoints": [
            {**row, "task_id": str(row["task_id"]), "created_at": _time(row["created_at"])}
            for row in Checkpoint.objects.filter(step_name__in=_waiting_steps()).values(
                "task_id", "step_index", "step_name", "output", "created_at"
            )
        ],
    }


def _waiting_steps() -> set[str]:
    from tasks import registry

    return {
        step.name
        for name in PLATFORM_PIPELINES
        for step in registry.get(name).steps
        if step.wait is not None or step.sleep is not None
    }


def report(result: CampaignResult) -> str:
    record = result.record
    states: dict[str, int] = {}
    for task in record["tasks"]:
        states[task["state"]] = states.get(task["state"], 0) + 1
    accepted = sum(1 for s in record["submissions"] if s["status"] in (200, 201))
    lines = [
        f"chaos campaign, seed {record['meta']['seed']}: {len(record['submissions'])} submissions "
        f"({accepted} accepted), {len(record['tasks'])} tasks "
        f"({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}), "
        f"{len(record['calls'])} platform calls, {result.seconds:.0f} s",
        "",
        invariants.format_table(record, result.results),
    ]
    if not result.settled:
        lines.append("\nFAIL: the system did not settle (tasks left in non-terminal states)")
    lines.append(f"\n{'PASS' if result.passed else 'FAIL'}: record and logs in {result.run_dir}")
    return "\n".join(lines)


__all__ = ["CampaignConfig", "CampaignResult", "DeploymentError", "report", "run"]
