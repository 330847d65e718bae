"""Invariants of a recorded chaos run: what must hold however hard the deployment was faulted.

Standard library only, no Django: the campaign dumps a *recorded run* (one JSON document) and this
module judges it, so a run can be judged again from its file alone (``python -m chaos.check``).
The record format and its validation live in ``chaos.record``; the invariants of live control
(cancels, a paused pipeline, limits) in ``chaos.control_invariants``, judged after these.
"""

from __future__ import annotations

import json
import urllib.parse
from collections import Counter, defaultdict

from chaos import control_invariants, schedule_invariants, wait_invariants
from chaos.record import (
    NOT_SUCCEEDED_STATES,
    TERMINAL_STATES,
    UNRESOLVED_DLQ_STATUSES,
    RecordedRun,
    RecordError,
    validate_record,
)
from chaos.verdicts import VIOLATIONS_SHOWN, Invariant, InvariantResult, registrar

__all__ = ["InvariantResult", "RecordError", "check", "fault_summary", "format_table", "validate_record"]

_INVARIANTS: list[Invariant] = []
_invariant = registrar(_INVARIANTS)


def check(record: dict) -> list[InvariantResult]:
    """Judge a recorded run against every invariant, in a fixed order; ``RecordError`` if it is malformed.

    The effects' invariants first (below), then those of live control: cancels, pauses, limits
    (``chaos.control_invariants``), then those of waits: signals and sleeps (``chaos.wait_invariants``), then
    those of the schedule (``chaos.schedule_invariants``).
    """
    validate_record(record)
    run = RecordedRun.of(record)
    judged = (
        *_INVARIANTS,
        *control_invariants.INVARIANTS,
        *wait_invariants.INVARIANTS,
        *schedule_invariants.INVARIANTS,
    )
    return [invariant(run) for invariant in judged]


def _between(count: int, generations: int) -> bool:
    return 1 <= count <= generations


def _expected(generations: int) -> str:
    return "1" if generations == 1 else f"1 to {generations} (one per generation)"


# --- the invariants -------------------------------------------------------------------------------------------------


@_invariant(
    "all_terminal",
    "every accepted submission names a task that exists and ended in one terminal state "
    "(succeeded, failed, compensated, compensation_failed or cancelled)",
)
def _all_terminal(run: RecordedRun) -> tuple[int, list[str]]:
    violations: list[str] = []
    requests_by_task: dict[str, list[str]] = defaultdict(list)
    accepted = run.accepted()
    for submission in accepted:
        if submission["task_id"] is None:
            violations.append(
                f"request {submission['request_id']}: accepted ({submission['status']}) but names no task"
            )
        else:
            requests_by_task[submission["task_id"]].append(submission["request_id"])
    for task_id, request_ids in requests_by_task.items():
        task = run.tasks.get(task_id)
        requests = ", ".join(request_ids)
        if task is None:
            violations.append(f"task {task_id} (request {requests}): lost task, no such task")
        elif task["state"] not in TERMINAL_STATES:
            violations.append(f"task {task_id} (request {requests}): lost task, still {task['state']}")
    return len(accepted), violations


@_invariant("one_task_per_key", "accepted submissions sharing an idempotency key got one task; one task row per key")
def _one_task_per_key(run: RecordedRun) -> tuple[int, list[str]]:
    # Keys are scoped per API client; a campaign submits as one client, so the key alone identifies a request.
    answered: dict[str, list[str]] = defaultdict(list)
    for submission in run.accepted():
        key, task_id = submission["idempotency_key"], submission["task_id"]
        if key is not None and task_id is not None and task_id not in answered[key]:
            answered[key].append(task_id)
    rows: dict[str, list[str]] = defaultdict(list)
    for task in run.tasks.values():
        if task["idempotency_key"] is not None:
            rows[task["idempotency_key"]].append(task["id"])
    violations = [
        f"key {key}: accepted submissions got {len(ids)} tasks ({', '.join(ids)})"
        for key, ids in answered.items()
        if len(ids) > 1
    ]
    violations += [
        f"key {key}: {len(ids)} task rows carry it ({', '.join(ids)})" for key, ids in rows.items() if len(ids) > 1
    ]
    return len(answered.keys() | rows.keys()), violations


@_invariant(
    "succeeded_effects_once",
    "a succeeded report task has one charge not refunded, one report, its own file and one notification",
)
def _succeeded_effects_once(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    tasks = run.platform_tasks(frozenset({"succeeded"}))
    for task in tasks:
        task_id, generations = task["id"], run.generations(task["id"])
        problems = []
        kept = [charge_id for charge_id, charge in run.charges.get(task_id, []) if not charge["refunded"]]
        if len(kept) != 1:
            problems.append(f"{len(kept)} charges not refunded ({', '.join(kept) or 'none'}), expected 1")
        if not _between(run.reports[task_id], generations):
            problems.append(f"{run.reports[task_id]} reports, expected {_expected(generations)}")
        own_file = f"report-{task_id}-g{task['generation']}.txt"
        files = run.files.get(task_id, [])
        if files != [own_file]:
            problems.append(f"files ({', '.join(files) or 'none'}), expected only {own_file}")
        if not _between(run.notifications[task_id], generations):
            problems.append(f"{run.notifications[task_id]} notifications, expected {_expected(generations)}")
        if problems:
            violations.append(f"task {task_id}: " + "; ".join(problems))
    return len(tasks), violations


@_invariant(
    "failed_compensated",
    "a report task that did not succeed has its charges refunded, no file, one open DLQ item, at most one notice",
)
def _failed_compensated(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    tasks = run.platform_tasks(NOT_SUCCEEDED_STATES)
    for task in tasks:
        task_id, generations = task["id"], run.generations(task["id"])
        problems = run.effects_left(task_id)
        unresolved = [item for item in run.dlq_items.get(task_id, []) if item["status"] in UNRESOLVED_DLQ_STATUSES]
        if len(unresolved) != 1:
            problems.append(f"{len(unresolved)} unresolved DLQ items, expected 1")
        elif not unresolved[0]["reason_code"].strip():
            problems.append("its DLQ item has no reason code")
        if run.failure_notices[task_id] > generations:
            problems.append(f"{run.failure_notices[task_id]} failure notices, expected at most {generations}")
        if problems:
            violations.append(f"task {task_id} ({task['state']}): " + "; ".join(problems))
    return len(tasks), violations


@_invariant("no_duplicate_charge", "at most one charge per task and generation, refunded or not")
def _no_duplicate_charge(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    for task_id, charges in run.charges.items():
        generations = run.generations(task_id)
        if len(charges) > generations:
            ids = ", ".join(charge_id for charge_id, _ in charges)
            violations.append(f"task {task_id}: {len(charges)} charges ({ids}), expected at most {generations}")
    return len(run.charges), violations


@_invariant(
    "no_refund_without_charge",
    "every refund that took effect undoes an existing charge of the same task; none for a succeeded task",
)
def _no_refund_without_charge(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    charges = run.record["platform"]["charges"]
    refunds = [call for call in run.record["calls"] if call["kind"] == "refund" and call["effect"]]
    seqs_by_task: dict[str, list[str]] = defaultdict(list)
    for call in refunds:
        charge_id = _refunded_charge_id(call["path"])
        charge = charges.get(charge_id)
        if charge is None:
            violations.append(
                f"call seq {call['seq']}: task {call['task_id']} refunded charge {charge_id}, which does not exist"
            )
        elif charge["task_id"] != call["task_id"]:
            owner = charge["task_id"]
            violations.append(
                f"call seq {call['seq']}: task {call['task_id']} refunded charge {charge_id} of task {owner}"
            )
        seqs_by_task[call["task_id"]].append(str(call["seq"]))
    for task_id, seqs in seqs_by_task.items():
        task = run.tasks.get(task_id)
        # Each earlier generation was compensated, so a task retried from the start may have refunded that often.
        if task is not None and task["state"] == "succeeded" and len(seqs) > task["generation"]:
            violations.append(f"task {task_id}: succeeded, yet refunded (call seq {', '.join(seqs)})")
    return len(refunds), violations


def _refunded_charge_id(path: str) -> str:
    # The simulator routes a refund only at /v1/quota/charges/<charge id>/refund; a hand-edited record may not.
    parts = path.split("/")
    return urllib.parse.unquote(parts[4]) if len(parts) == 6 else path


@_invariant("no_late_calls", "no call reached the platform after the deadline it carried")
def _no_late_calls(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    calls = run.record["calls"]
    for call in calls:
        deadline, received = call["deadline_ms"], call["received_ms"]
        if call["late"] or (deadline is not None and received > deadline):
            by = f" {received - deadline} ms" if deadline is not None and received > deadline else ""
            violations.append(
                f"call seq {call['seq']}: {call['method']} {call['path']} (task {call['task_id']}) arrived{by} late"
            )
    return len(calls), violations


@_invariant("no_key_reuse", "no idempotency key at the platform was used for two different requests")
def _no_key_reuse(run: RecordedRun) -> tuple[int, list[str]]:
    calls = run.record["calls"]
    requests: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for call in calls:
        if call["idempotency_key"] is not None:
            requests[call["idempotency_key"]][_fingerprint(call)].append(call)
    violations, reused = [], set()
    for key, by_request in requests.items():
        if len(by_request) > 1:
            reused.add(key)
            firsts = "; ".join(f"seq {c[0]['seq']}: {c[0]['method']} {c[0]['path']}" for c in by_request.values())
            violations.append(f"key {key}: used for {len(by_request)} different requests ({firsts})")
    # The simulator answers 422 only to a reused key (an injected 422 carries a fault label). This also
    # catches a first use that happened before the recording started.
    for call in calls:
        if call["status"] == 422 and call["fault"] is None and call["idempotency_key"] not in reused:
            violations.append(f"call seq {call['seq']}: key {call['idempotency_key']} answered 422 (key reused)")
    return len(requests), violations


def _fingerprint(call: dict) -> str:
    # The simulator's own request fingerprint: method, path and the canonical JSON of the body.
    return f"{call['method']} {call['path']} {json.dumps(call['body'], sort_keys=True, separators=(',', ':'))}"


@_invariant(
    "attempts_within_policy",
    "per task generation: tries within the retry budgets and crashes within max_crashes "
    "(pipelines absent from meta.policies are skipped and not counted)",
)
def _attempts_within_policy(run: RecordedRun) -> tuple[int, list[str]]:
    meta = run.record["meta"]
    policies, max_crashes = meta["policies"], meta["max_crashes"]
    by_generation: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for attempt in run.record["attempts"]:
        task = run.tasks.get(attempt["task_id"])
        if task is not None and task["pipeline"] in policies:
            by_generation[(attempt["task_id"], attempt["generation"])].append(attempt)
    violations = []
    for (task_id, generation), attempts in by_generation.items():
        policy = policies[run.tasks[task_id]["pipeline"]]
        where = f"task {task_id} generation {generation}"
        step_crashes = sum(1 for a in attempts if a["outcome"] == "crashed" and a["kind"] == "step")
        cleanup_crashes = sum(1 for a in attempts if a["outcome"] == "crashed" and a["kind"] != "step")
        # A compensation run counts its tries from 1; a crash starts a new run, with a fresh budget.
        cleanup_runs = 1 + cleanup_crashes
        budgets = {
            "step": policy["max_attempts"],
            "compensation": policy["compensation_max_attempts"] * cleanup_runs,
            "failure_notice": policy["max_attempts"] * cleanup_runs,
        }
        tries = Counter((a["kind"], a["step_index"], a["step_name"]) for a in attempts if a["outcome"] != "crashed")
        for (kind, _, step_name), count in tries.items():
            if count > budgets[kind]:
                violations.append(f"{where}: {kind} {step_name!r} tried {count} times, budget {budgets[kind]}")
        if step_crashes > max_crashes:
            violations.append(f"{where}: {step_crashes} crashes while running, max_crashes {max_crashes}")
        # The sweeper fails a phase when the shared crash count reaches max_crashes, so the compensation
        # after a crash loop still gets its one crash.
        crash_budget = max(max_crashes, step_crashes + 1)
        if step_crashes + cleanup_crashes > crash_budget:
            violations.append(f"{where}: {step_crashes + cleanup_crashes} crashes in all, budget {crash_budget}")
    return len(by_generation), violations


# --- reporting ------------------------------------------------------------------------------------------------------


def fault_summary(record: dict) -> list[tuple[str, int]]:
    """Faults the campaign injected (by kind, in order of first use), then those the platform injected."""
    # The campaign marks a fault it tried and failed to inject: it must not pass for one that happened.
    injected = Counter(
        f"{fault['kind']} (failed to inject)" if fault.get("failed") is True else fault["kind"]
        for fault in record["faults"]
    )
    platform: Counter[str] = Counter()
    for call in record["calls"]:
        if call["fault"] is not None:
            platform[f"platform {call['fault']}"] += 1
        elif call["status"] == 402 and not call["replayed"]:
            # A replayed 402 repeats an answer already counted.
            platform["platform 402 insufficient quota"] += 1
    return list(injected.items()) + sorted(platform.items())


def format_table(record: dict, results: list[InvariantResult]) -> str:
    """A plain-text report: the faults injected, then each invariant with its first violations when it fails."""
    meta = record["meta"]
    lines = [
        f"chaos run: seed {meta['seed']}, {meta['tasks']} tasks, {meta['workers']} workers, "
        f"max_crashes {meta['max_crashes']}",
        "",
    ]
    # Recorded since the campaign can run other topologies; older records have none.
    topology = meta.get("topology")
    if isinstance(topology, dict) and topology:
        lines[1:1] = ["topology: " + "; ".join(f"{part} {what}" for part, what in topology.items())]
    faults = fault_summary(record)
    width = max([len("fault injected"), *(len(kind) for kind, _ in faults)])
    lines.append(f"{'fault injected':<{width}}  {'count':>7}")
    lines += [f"{kind:<{width}}  {count:>7}" for kind, count in faults] or ["(none)"]
    lines.append("")
    if record["cancels"] or record["controls"] or record.get("signals_sent") or record.get("schedules"):
        actions = control_invariants.control_summary(record)
        width = max(len("live control"), *(len(what) for what, _ in actions))
        lines.append(f"{'live control':<{width}}  {'count':>7}")
        lines += [f"{what:<{width}}  {count:>7}" for what, count in actions]
        lines.append("")
    width = max([len("invariant"), *(len(result.name) for result in results)])
    lines.append(f"{'invariant':<{width}}  {'checked':>7}  {'violations':>10}  result")
    for result in results:
        verdict = "PASS" if result.holds else "FAIL"
        lines.append(f"{result.name:<{width}}  {result.checked:>7}  {len(result.violations):>10}  {verdict}")
        if not result.holds:
            lines.append(f"    {result.description}")
            lines += [f"    - {violation}" for violation in result.violations[:VIOLATIONS_SHOWN]]
            if len(result.violations) > VIOLATIONS_SHOWN:
                lines.append(f"    ... and {len(result.violations) - VIOLATIONS_SHOWN} more")
    lines += ["", f"{sum(result.holds for result in results)} of {len(results)} invariants hold"]
    return "\n".join(lines)
