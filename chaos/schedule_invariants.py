"""Invariants of a schedule in a recorded run: one task per slot, none before its time or after the pause, and
every slot of the run either fired, skipped or counted missed.

Judged last (``chaos.invariants.check``), from the record's optional sections ``schedules``, ``schedule_runs``
and ``schedule_controls`` (``chaos.record``); a record without them has nothing to judge here. The checker
knows interval schedules (``every_seconds``), the campaign's kind. Standard library only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime

from chaos.record import RecordedRun, seconds
from chaos.verdicts import Invariant, registrar

INVARIANTS: list[Invariant] = []
_invariant = registrar(INVARIANTS)

# A schedule's first slot is the first after the moment the sweeper synced it; its row's created_at is read a
# moment later. A slot within this much before created_at may or may not have been the first.
SYNC_SLACK_SECONDS = 0.5
MICROSECONDS = 1_000_000


def slot_key(name: str, slot: str) -> str:
    """The idempotency key of the task of ``name``'s slot (``tasks.lifecycle.schedules.slot_key``)."""
    moment = datetime.fromisoformat(slot).astimezone(UTC)
    return f"schedule:{name}:{moment.isoformat().replace('+00:00', 'Z')}"


def _micros(text: str) -> int:
    return round(seconds(text) * MICROSECONDS)


def _grid_after(moment: float, every: int) -> int:
    """The first slot (microseconds since the epoch) strictly after ``moment`` (seconds)."""
    return (round(moment * MICROSECONDS) // every + 1) * every


def _pause_returned(run: RecordedRun, name: str) -> str | None:
    pauses = [
        control["returned_at"]
        for control in run.record.get("schedule_controls", [])
        if control["schedule"] == name and control["action"] == "pause" and not control.get("failed")
    ]
    return min(pauses, key=seconds) if pauses else None


@_invariant(
    "one_task_per_slot",
    "each slot of a schedule fired once, on its grid, with one task under its slot's key created at or after the "
    "slot; none after the schedule's pause returned",
)
def _one_task_per_slot(run: RecordedRun) -> tuple[int, list[str]]:
    runs_by_schedule: dict[str, list[dict]] = defaultdict(list)
    for fired in run.record.get("schedule_runs", []):
        runs_by_schedule[fired["schedule"]].append(fired)
    violations, checked = [], 0
    for schedule in run.record.get("schedules", []):
        name, every = schedule["name"], round(schedule["every_seconds"] * MICROSECONDS)
        runs = runs_by_schedule.get(name, [])
        checked += len(runs)
        for slot, count in Counter(_micros(fired["slot_at"]) for fired in runs).items():
            if count > 1:
                violations.append(f"schedule {name}: the slot at {slot / MICROSECONDS:.6f} fired {count} times")
        keys = {slot_key(name, fired["slot_at"]) for fired in runs}
        paused = _pause_returned(run, name)
        for fired in runs:
            where = f"schedule {name}: slot {fired['slot_at']}"
            if _micros(fired["slot_at"]) % every:
                violations.append(f"{where}: not on its grid of {schedule['every_seconds']:g} s")
            if paused is not None and seconds(fired["slot_at"]) > seconds(paused):
                violations.append(f"{where}: fired after the pause returned at {paused}")
            if fired["task_id"] is None:
                if not fired["error"]:
                    violations.append(f"{where}: fired without a task or an error")
                continue
            task = run.tasks.get(fired["task_id"])
            if task is None:
                violations.append(f"{where}: its task {fired['task_id']} does not exist")
                continue
            if task["idempotency_key"] != slot_key(name, fired["slot_at"]):
                violations.append(f"{where}: its task {task['id']} has the key {task['idempotency_key']!r}")
            created = task.get("created_at")
            if created is not None and seconds(created) < seconds(fired["slot_at"]):
                violations.append(f"{where}: its task {task['id']} was created at {created}, before its slot")
        prefix = f"schedule:{name}:"
        tasks_by_key: dict[str, list[str]] = defaultdict(list)
        for task in run.tasks.values():
            if (task["idempotency_key"] or "").startswith(prefix):
                tasks_by_key[task["idempotency_key"]].append(task["id"])
        for task_key, ids in tasks_by_key.items():
            if len(ids) > 1:
                violations.append(f"key {task_key}: {len(ids)} tasks ({', '.join(ids)})")
            if task_key not in keys:
                violations.append(f"key {task_key}: task {ids[0]} has no fired slot of its schedule")
    return checked, violations


@_invariant(
    "slots_accounted",
    "every slot of a schedule from its first to its last is fired, skipped (overlap) or counted missed (outage), "
    "and one did fire in a run long enough for three",
)
def _slots_accounted(run: RecordedRun) -> tuple[int, list[str]]:
    runs = Counter(fired["schedule"] for fired in run.record.get("schedule_runs", []))
    violations, checked = [], 0
    for schedule in run.record.get("schedules", []):
        name, every = schedule["name"], round(schedule["every_seconds"] * MICROSECONDS)
        created = seconds(schedule["created_at"])
        last = schedule["last_slot_at"]
        if last is None:
            ended = _pause_returned(run, name) or schedule["paused_at"]
            if ended is not None and seconds(ended) - created > 3 * schedule["every_seconds"]:
                violations.append(f"schedule {name}: no slot fired between {schedule['created_at']} and {ended}")
            continue
        first = _grid_after(created - SYNC_SLACK_SECONDS, every)
        expected = (_micros(last) - first) // every + 1
        # The first candidate within the slack before created_at may have passed before the sync: one fewer.
        allowed = {expected, expected - 1} if first <= round(created * MICROSECONDS) else {expected}
        accounted = runs[name] + schedule["slots_skipped"] + schedule["slots_missed"]
        checked += expected
        if accounted not in allowed:
            violations.append(
                f"schedule {name}: {expected} slots from its first to {last}, but {runs[name]} fired, "
                f"{schedule['slots_skipped']} skipped and {schedule['slots_missed']} missed"
            )
    return checked, violations
