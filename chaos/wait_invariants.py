"""Invariants of waits in a recorded run: signals kept and consumed once, no resume before its signal or time.

Judged after the effects' and live control's invariants (``chaos.invariants.check``), from the record's
optional sections ``signals_sent``, ``signals`` and ``wait_checkpoints`` and the policies' ``waits`` and
``sleeps`` (``chaos.record``). A record without them (a campaign before waits) has nothing to judge here: each
invariant holds over 0 items. Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.record import TERMINAL_STATES, RecordedRun, seconds
from chaos.verdicts import Invariant, registrar

INVARIANTS: list[Invariant] = []
_invariant = registrar(INVARIANTS)

SIGNAL_TIMEOUT = "signal_timeout"
ACCEPTED = 202
# A signal's received_at is read before its row commits: a wait that looked for it a moment later may not have
# seen it yet. A signal stored longer than this before a wait gave up on it was lost.
COMMIT_SLACK_SECONDS = 0.5
# The API answers times to the millisecond (Django's JSON); the record has the stored microseconds.
API_TIME_RESOLUTION = 0.001


def _stored(run: RecordedRun) -> dict[tuple[str, str], list[dict]]:
    stored: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in run.record.get("signals", []):
        stored[(row["task_id"], row["name"])].append(row)
    return stored


def _policy_steps(run: RecordedRun, task_id: str, kind: str) -> list[str]:
    task = run.tasks.get(task_id)
    policy = run.record["meta"]["policies"].get(task["pipeline"]) if task is not None else None
    return list(policy.get(kind, [])) if policy is not None else []


def _later_starts(run: RecordedRun, task_id: str, step_index: int) -> list[dict]:
    """The task's attempts of steps after ``step_index`` in its current generation (the checkpoints' own)."""
    generation = run.tasks[task_id]["generation"] if task_id in run.tasks else 0
    return [
        attempt
        for attempt in run.attempts.get(task_id, [])
        if attempt["kind"] == "step"
        and attempt["generation"] == generation
        and attempt["step_index"] > step_index
        and attempt["started_at"] is not None
    ]


@_invariant(
    "signal_consumed_once",
    "each signal is stored once, as first sent: its repeats answered with the first answer, another decision "
    "refused (409); a wait's checkpoint is its task's stored signal",
)
def _signal_consumed_once(run: RecordedRun) -> tuple[int, list[str]]:
    stored = _stored(run)
    sent: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for send in run.record.get("signals_sent", []):
        sent[(send["task_id"], send["name"])].append(send)
    violations = []
    for (task_id, name), rows in stored.items():
        if len(rows) > 1:
            violations.append(f"task {task_id}: signal {name!r} stored {len(rows)} times")
    for (task_id, name), sends in sent.items():
        rows = stored.get((task_id, name), [])
        row = rows[0] if rows else None
        for send in sends:
            where = f"task {task_id}: signal {name!r} ({send['role']}, request {send['request_id']})"
            if send["status"] != ACCEPTED:
                continue
            if send["role"] == "conflict":
                violations.append(f"{where}: a different payload was accepted, expected 409 signal_already_received")
            elif row is None:
                violations.append(f"{where}: accepted (202) but not stored: a lost signal")
            else:
                answered = seconds(send["received_at"]) if send["received_at"] is not None else None
                if answered is None or abs(answered - seconds(row["received_at"])) >= API_TIME_RESOLUTION:
                    violations.append(
                        f"{where}: answered received_at {send['received_at']}, stored {row['received_at']}"
                    )
                if send["payload"] != row["payload"]:
                    violations.append(f"{where}: stored payload {row['payload']!r}, sent {send['payload']!r}")
    checkpoints = [
        checkpoint
        for checkpoint in run.record.get("wait_checkpoints", [])
        if checkpoint["step_name"] in _policy_steps(run, checkpoint["task_id"], "waits")
    ]
    for checkpoint in checkpoints:
        task_id, name = checkpoint["task_id"], checkpoint["step_name"]
        rows = stored.get((task_id, name), [])
        if not rows:
            violations.append(f"task {task_id}: went past its wait {name!r} with no signal stored")
        elif checkpoint["output"] != rows[0]["payload"]:
            violations.append(
                f"task {task_id}: its wait {name!r} recorded {checkpoint['output']!r}, the signal was "
                f"{rows[0]['payload']!r}"
            )
    return len(sent.keys() | stored.keys()), violations


@_invariant(
    "no_early_resume",
    "no task went past a wait before its signal was stored, or past a sleep before the time it slept until",
)
def _no_early_resume(run: RecordedRun) -> tuple[int, list[str]]:
    stored = _stored(run)
    violations, checked = [], 0
    for checkpoint in run.record.get("wait_checkpoints", []):
        task_id, name = checkpoint["task_id"], checkpoint["step_name"]
        if name in _policy_steps(run, task_id, "waits"):
            rows = stored.get((task_id, name), [])
            if not rows:
                continue  # judged by signal_consumed_once
            resumable, what = rows[0]["received_at"], f"its signal {name!r} came at {rows[0]['received_at']}"
        elif name in _policy_steps(run, task_id, "sleeps"):
            resumable = (checkpoint["output"] or {}).get("slept_until")
            if not isinstance(resumable, str):
                violations.append(f"task {task_id}: its sleep {name!r} recorded no slept_until")
                continue
            what = f"its sleep {name!r} lasted until {resumable}"
        else:
            continue
        checked += 1
        if seconds(checkpoint["created_at"]) < seconds(resumable):
            violations.append(f"task {task_id}: {name!r} checkpointed at {checkpoint['created_at']}, but {what}")
        for attempt in _later_starts(run, task_id, checkpoint["step_index"]):
            if seconds(attempt["started_at"]) < seconds(resumable):
                violations.append(
                    f"task {task_id}: step {attempt['step_name']!r} started at {attempt['started_at']}, but {what}"
                )
    return checked, violations


@_invariant(
    "waits_end_as_decided",
    "a task that waits for approval succeeded only with a yes and every wait and sleep passed; a no ended it "
    "without a report; a wait that timed out did so with no signal stored before it",
)
def _waits_end_as_decided(run: RecordedRun) -> tuple[int, list[str]]:
    stored = _stored(run)
    checkpointed: dict[str, set[str]] = defaultdict(set)
    for checkpoint in run.record.get("wait_checkpoints", []):
        checkpointed[checkpoint["task_id"]].add(checkpoint["step_name"])
    violations, checked = [], 0
    for task in run.tasks.values():
        waits = _policy_steps(run, task["id"], "waits")
        if not waits or task["state"] not in TERMINAL_STATES:
            continue
        checked += 1
        task_id, state = task["id"], task["state"]
        decisions = {name: stored[(task_id, name)][0]["payload"] for name in waits if (task_id, name) in stored}
        rejected = [name for name, payload in decisions.items() if (payload or {}).get("approved") is False]
        if rejected and (state == "succeeded" or run.reports[task_id]):
            violations.append(
                f"task {task_id}: {rejected[0]!r} said no, yet it is {state} with {run.reports[task_id]} reports"
            )
        if state == "succeeded":
            missing = [
                step for step in (*waits, *_policy_steps(run, task_id, "sleeps")) if step not in checkpointed[task_id]
            ]
            if missing:
                violations.append(f"task {task_id}: succeeded without passing {', '.join(missing)}")
            unapproved = [name for name in waits if (decisions.get(name) or {}).get("approved") is not True]
            if unapproved:
                violations.append(f"task {task_id}: succeeded without a yes for {', '.join(unapproved)}")
        if task.get("failure_code") == SIGNAL_TIMEOUT:
            for attempt in run.attempts.get(task_id, []):
                name = attempt["step_name"]
                if name not in waits or attempt["outcome"] != "permanent_error" or attempt["started_at"] is None:
                    continue
                rows = stored.get((task_id, name), [])
                gave_up = seconds(attempt["started_at"])
                if rows and seconds(rows[0]["received_at"]) < gave_up - COMMIT_SLACK_SECONDS:
                    violations.append(
                        f"task {task_id}: its wait {name!r} timed out at {attempt['started_at']}, but its signal "
                        f"was stored at {rows[0]['received_at']}"
                    )
    return checked, violations
