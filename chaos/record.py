"""The recorded run of a chaos campaign: its format, its structural validation, and the run indexed for checks.

A recorded run is an object with these sections. The fields listed are the ones the checker reads and
requires; any other field (a submission's body, a task's input or failure) is kept for people reading it::

    meta         {"seed", "tasks", "workers", "max_crashes", "platform_pipelines": [pipeline],
                  "policies": {pipeline: {"steps", "max_attempts", "compensation_max_attempts",
                                          "compensated_steps", "on_cancel": "compensate" | "park",
                                          "max_concurrency", "rate_limit": {"count", "window_seconds"} | null}}}
    faults       [{"kind", "at", "detail"}]                       what the campaign did to the deployment
    controls     [{"action": "pause" | "resume", "pipeline", "called_at", "returned_at"}]   the operator's
    submissions  [{"request_id", "idempotency_key", "status", "task_id", "replayed"}]   status 0: no answer
                 (a campaign's also say "batch": the batch a submission was first sent in, or null)
    cancels      [{"request_id", "task_id", "repeat", "status", "state", "requested_at"}]   status 0: no answer
    tasks        [{"id", "pipeline", "state", "generation", "idempotency_key", "cancel_requested_at"}]
    dlq_items    [{"task_id", "status", "reason_code"}]
    attempts     [{"task_id", "kind", "generation", "step_index", "step_name", "attempt", "outcome",
                   "fencing_token", "started_at", "finished_at"}]
    ledger       [{"task_id", "generation", "step_name", "effect_name", "effect_key", "status"}]
    calls        ReportPlatformSimulator.calls(), unchanged
    platform     ReportPlatformSimulator.state(), unchanged

and, in a campaign with waits (optional sections: a record without them has no waits to judge; a policy may
also say "waits" and "sleeps", its wait and sleep steps' names)::

    signals_sent      [{"request_id", "task_id", "name", "role": "first" | "repeat" | "conflict", "payload",
                        "status", "code", "received_at"}]     what the clients sent; status 0: no answer
    signals           [{"task_id", "name", "payload", "received_at"}]      the signals the engine stored
    wait_checkpoints  [{"task_id", "step_index", "step_name", "output", "created_at"}]   of wait and sleep steps

and, in a campaign with a schedule (a task's "created_at" too)::

    schedules          [{"name", "every_seconds", "created_at", "last_slot_at", "paused_at", "slots_skipped",
                         "slots_missed"}]                        the schedule's row at the end
    schedule_runs      [{"schedule", "slot_at", "task_id", "error"}]      one per slot fired
    schedule_controls  [{"action": "pause", "schedule", "called_at", "returned_at"}]   the campaign's pause

Times are ISO 8601 with their offset (``null``: not known, e.g. a crashed attempt's start); a call's
``received_ms`` is epoch milliseconds. Every process of a campaign runs on one machine, so every time in a
record was read from one clock. States, statuses, kinds and outcomes are the values of tasks.models (a unit
test keeps the copies below in step with them).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["RecordError", "RecordedRun", "seconds", "validate_record"]

TERMINAL_STATES = frozenset({"succeeded", "failed", "compensated", "compensation_failed", "cancelled"})
# Failed for good: each has its dead letter (a cancelled task has one only when its compensation failed).
NOT_SUCCEEDED_STATES = frozenset({"failed", "compensated", "compensation_failed"})
TASK_STATES = TERMINAL_STATES | {"queued", "running", "retry_scheduled", "waiting", "compensating"}
UNRESOLVED_DLQ_STATUSES = frozenset({"open", "retrying", "compensating", "compensated"})
DLQ_STATUSES = UNRESOLVED_DLQ_STATUSES | {"resolved"}
ATTEMPT_KINDS = frozenset({"step", "compensation", "failure_notice"})
ATTEMPT_OUTCOMES = frozenset(
    {"succeeded", "transient_error", "permanent_error", "timeout", "crashed", "deadline_exceeded", "cancelled"}
)
EFFECT_STATUSES = frozenset({"done", "uncertain", "compensated"})
# The failure reason (and dead-letter reason code) of a cancel.
CANCELLED_REASON = "cancelled"
CONTROL_ACTIONS = frozenset({"pause", "resume"})
# The API answers a new task with 201 and replays that answer for a repeated key; 200 would be a success too.
ACCEPTED_STATUSES = frozenset({200, 201})
# A cancel is answered 200 once the task is terminal, 202 while it is under way.
CANCEL_ACCEPTED_STATUSES = frozenset({200, 202})


class RecordError(ValueError):
    """A recorded run that is not structurally valid; the message is one readable line."""


# --- structure ------------------------------------------------------------------------------------------------------

_NONE = type(None)
_STR, _OPT_STR, _INT, _OPT_INT, _BOOL, _NUMBER = (str,), (str, _NONE), (int,), (int, _NONE), (bool,), (float,)
_SECTIONS = {
    "meta": dict,
    "faults": list,
    "controls": list,
    "submissions": list,
    "cancels": list,
    "tasks": list,
    "dlq_items": list,
    "attempts": list,
    "ledger": list,
    "calls": list,
    "platform": dict,
}
# Sections a record of a campaign with waits has (chaos.wait_invariants); an older record lacks them.
_OPTIONAL_SECTIONS = {
    "signals_sent": list,
    "signals": list,
    "wait_checkpoints": list,
    "schedules": list,
    "schedule_runs": list,
    "schedule_controls": list,
}
SIGNAL_ROLES = frozenset({"first", "repeat", "conflict"})
_META_FIELDS = {
    "seed": _INT,
    "tasks": _INT,
    "workers": _INT,
    "max_crashes": _INT,
    "platform_pipelines": (list,),
    "policies": (dict,),
}
_OPT_DICT = (dict, _NONE)
_POLICY_FIELDS = {
    "steps": (list,),
    "max_attempts": _INT,
    "compensation_max_attempts": _INT,
    "compensated_steps": (list,),
    "on_cancel": _STR,
    "max_concurrency": _OPT_INT,
    "rate_limit": _OPT_DICT,
}
_RATE_FIELDS = {"count": _INT, "window_seconds": _NUMBER}
_ITEM_FIELDS = {
    "faults": {"kind": _STR, "at": _NUMBER, "detail": _STR},
    "controls": {"action": _STR, "pipeline": _STR, "called_at": _STR, "returned_at": _STR},
    "submissions": {
        "request_id": _STR,
        "idempotency_key": _OPT_STR,
        "status": _INT,
        "task_id": _OPT_STR,
        "replayed": _BOOL,
    },
    "cancels": {
        "request_id": _STR,
        "task_id": _STR,
        "repeat": _BOOL,
        "status": _INT,
        "state": _OPT_STR,
        "requested_at": _OPT_STR,
    },
    "tasks": {
        "id": _STR,
        "pipeline": _STR,
        "state": _STR,
        "generation": _INT,
        "idempotency_key": _OPT_STR,
        "cancel_requested_at": _OPT_STR,
    },
    "dlq_items": {"task_id": _STR, "status": _STR, "reason_code": _STR},
    "attempts": {
        "task_id": _STR,
        "kind": _STR,
        "generation": _INT,
        "step_index": _INT,
        "step_name": _STR,
        "attempt": _INT,
        "outcome": _STR,
        "fencing_token": _INT,
        "started_at": _OPT_STR,
        "finished_at": _OPT_STR,
    },
    "ledger": {
        "task_id": _STR,
        "generation": _INT,
        "step_name": _STR,
        "effect_name": _STR,
        "effect_key": _STR,
        "status": _STR,
    },
    "calls": {
        "seq": _INT,
        "method": _STR,
        "path": _STR,
        "task_id": _OPT_STR,
        "idempotency_key": _OPT_STR,
        "deadline_ms": _OPT_INT,
        "received_ms": _INT,
        "status": _INT,
        "replayed": _BOOL,
        "effect": _BOOL,
        "fault": _OPT_STR,
        "late": _BOOL,
        "body": (object,),
        "kind": _OPT_STR,
    },
    "signals_sent": {
        "request_id": _STR,
        "task_id": _STR,
        "name": _STR,
        "role": _STR,
        "payload": (object,),
        "status": _INT,
        "code": _OPT_STR,
        "received_at": _OPT_STR,
    },
    "signals": {"task_id": _STR, "name": _STR, "payload": (object,), "received_at": _STR},
    "schedules": {
        "name": _STR,
        "every_seconds": _NUMBER,
        "created_at": _STR,
        "last_slot_at": _OPT_STR,
        "paused_at": _OPT_STR,
        "slots_skipped": _INT,
        "slots_missed": _INT,
    },
    "schedule_runs": {"schedule": _STR, "slot_at": _STR, "task_id": _OPT_STR, "error": _STR},
    "schedule_controls": {"action": _STR, "schedule": _STR, "called_at": _STR, "returned_at": _STR},
    "wait_checkpoints": {
        "task_id": _STR,
        "step_index": _INT,
        "step_name": _STR,
        "output": (object,),
        "created_at": _STR,
    },
}
_CHOICES = {
    "controls": {"action": CONTROL_ACTIONS},
    "tasks": {"state": TASK_STATES},
    "dlq_items": {"status": DLQ_STATUSES},
    "attempts": {"kind": ATTEMPT_KINDS, "outcome": ATTEMPT_OUTCOMES},
    "ledger": {"status": EFFECT_STATUSES},
    "signals_sent": {"role": SIGNAL_ROLES},
    "schedule_controls": {"action": frozenset({"pause"})},
}
_TIME_FIELDS = {
    "controls": ("called_at", "returned_at"),
    "cancels": ("requested_at",),
    "tasks": ("cancel_requested_at",),
    "attempts": ("started_at", "finished_at"),
    "signals_sent": ("received_at",),
    "signals": ("received_at",),
    "wait_checkpoints": ("created_at",),
    "schedules": ("created_at", "last_slot_at", "paused_at"),
    "schedule_runs": ("slot_at",),
    "schedule_controls": ("called_at", "returned_at"),
}
_PLATFORM_FIELDS = {"charges": (dict,), "files": (dict,), "notifications": (list,), "reports": (list,)}
_CHARGE_FIELDS = {"task_id": _OPT_STR, "refunded": _BOOL}
_EFFECT_FIELDS = {"task_id": _OPT_STR}
_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
    _NONE: "null",
}


def validate_record(record: Any) -> None:
    """Raise ``RecordError`` naming the first place where ``record`` is not a recorded run."""
    _fields(record, {section: (kind,) for section, kind in _SECTIONS.items()}, "")
    _fields(record, {section: (kind,) for section, kind in _OPTIONAL_SECTIONS.items() if section in record}, "")
    meta = record["meta"]
    _fields(meta, _META_FIELDS, "meta")
    for index, pipeline in enumerate(meta["platform_pipelines"]):
        if not isinstance(pipeline, str):
            raise RecordError(f"meta.platform_pipelines[{index}]: expected a string, got {_shown(pipeline)}")
    for pipeline, policy in meta["policies"].items():
        where = f"meta.policies.{pipeline}"
        _fields(policy, _POLICY_FIELDS, where)
        for name in ("max_attempts", "compensation_max_attempts", "max_concurrency"):
            if policy[name] is not None and policy[name] < 1:
                raise RecordError(f"{where}.{name}: must be at least 1, got {policy[name]}")
        if policy["rate_limit"] is not None:
            _fields(policy["rate_limit"], _RATE_FIELDS, f"{where}.rate_limit")
            if policy["rate_limit"]["count"] < 1 or not policy["rate_limit"]["window_seconds"] > 0:
                raise RecordError(f"{where}.rate_limit: must allow at least 1 start per positive window")
        for name in ("waits", "sleeps"):
            steps = policy.get(name, [])
            if not isinstance(steps, list) or not all(isinstance(step, str) for step in steps):
                raise RecordError(f"{where}.{name}: expected a list of step names, got {_shown(steps)}")
    for section, fields in _ITEM_FIELDS.items():
        for index, item in enumerate(record.get(section, [])):  # an optional section may be absent
            where = f"{section}[{index}]"
            _fields(item, fields, where)
            for name, allowed in _CHOICES.get(section, {}).items():
                if item[name] not in allowed:
                    raise RecordError(
                        f"{where}.{name}: expected one of {', '.join(sorted(allowed))}, got {item[name]!r}"
                    )
            for name in _TIME_FIELDS.get(section, ()):
                if item[name] is not None and _parsed_time(item[name]) is None:
                    raise RecordError(f"{where}.{name}: expected an ISO 8601 time with its offset, got {item[name]!r}")
    duplicates = [task_id for task_id, n in Counter(t["id"] for t in record["tasks"]).items() if n > 1]
    if duplicates:
        raise RecordError(f"tasks: task {duplicates[0]} is listed more than once")
    platform = record["platform"]
    _fields(platform, _PLATFORM_FIELDS, "platform")
    for charge_id, charge in platform["charges"].items():
        _fields(charge, _CHARGE_FIELDS, f"platform.charges.{charge_id}")
    for name, file in platform["files"].items():
        _fields(file, _EFFECT_FIELDS, f"platform.files.{name}")
    for section in ("notifications", "reports"):
        for index, item in enumerate(platform[section]):
            _fields(item, _EFFECT_FIELDS, f"platform.{section}[{index}]")


def _fields(value: Any, fields: dict[str, tuple[type, ...]], where: str) -> None:
    if not isinstance(value, dict):
        raise RecordError(f"{where or 'the record'}: expected an object, got {_shown(value)}")
    for name, types in fields.items():
        if name not in value:
            raise RecordError(f"{where or 'the record'}: missing {name!r}")
        field = value[name]
        if float in types and isinstance(field, int) and not isinstance(field, bool):
            field = float(field)  # JSON has one number type: 3 is as good a number of seconds as 3.0
        # bool is an int to isinstance(); a recorded true is never a count.
        if not isinstance(field, types) or (isinstance(field, bool) and bool not in types and object not in types):
            expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
            raise RecordError(f"{where + '.' if where else ''}{name}: expected {expected}, got {_shown(field)}")


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parsed_time(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else None  # a time without its offset is no time on one clock


def seconds(text: str) -> float:
    """A recorded time (ISO 8601 with its offset) as seconds since the epoch."""
    value = _parsed_time(text)
    if value is None:
        raise RecordError(f"not a time: {text!r}")
    return value.timestamp()


# --- the run, indexed -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRun:
    """A validated record with the lookups the invariants share."""

    record: dict
    tasks: dict[str, dict]
    charges: dict[str, list[tuple[str, dict]]]  # task id -> [(charge id, charge)]
    files: dict[str, list[str]]  # task id -> file names
    reports: Counter[str]
    notifications: Counter[str]
    failure_notices: Counter[str]
    dlq_items: dict[str, list[dict]]
    attempts: dict[str, list[dict]]  # task id -> its attempts, as recorded
    ledger: dict[str, list[dict]]  # task id -> its ledger entries
    calls: dict[str, list[dict]]  # task id -> its calls at the platform, in arrival order
    cancels: dict[str, list[dict]]  # task id -> the cancel requests sent for it

    @classmethod
    def of(cls, record: dict) -> RecordedRun:
        platform = record["platform"]
        charges: dict[str, list[tuple[str, dict]]] = defaultdict(list)
        for charge_id, charge in platform["charges"].items():
            charges[charge["task_id"]].append((charge_id, charge))
        files: dict[str, list[str]] = defaultdict(list)
        for name, file in sorted(platform["files"].items()):
            files[file["task_id"]].append(name)
        return cls(
            record=record,
            tasks={task["id"]: task for task in record["tasks"]},
            charges=dict(charges),
            files=dict(files),
            reports=Counter(report["task_id"] for report in platform["reports"]),
            notifications=Counter(notification["task_id"] for notification in platform["notifications"]),
            failure_notices=_failure_notices(record),
            dlq_items=_by_task(record["dlq_items"]),
            attempts=_by_task(record["attempts"]),
            ledger=_by_task(record["ledger"]),
            calls=_by_task(sorted(record["calls"], key=lambda call: call["seq"])),
            cancels=_by_task(record["cancels"]),
        )

    def generations(self, task_id: str) -> int:
        """Generations a task has started: each one compensated may leave a refunded charge, a report, a notice."""
        task = self.tasks.get(task_id)
        return task["generation"] + 1 if task is not None else 1

    def platform_tasks(self, states: frozenset[str]) -> list[dict]:
        pipelines = set(self.record["meta"]["platform_pipelines"])
        return [t for t in self.tasks.values() if t["pipeline"] in pipelines and t["state"] in states]

    def effects_left(self, task_id: str) -> list[str]:
        """What of a task's undoable effects is still at the platform: charges not refunded, files not deleted."""
        left = []
        kept = [charge_id for charge_id, charge in self.charges.get(task_id, []) if not charge["refunded"]]
        if kept:
            left.append(f"charge {', '.join(kept)} not refunded")
        if self.files.get(task_id):
            left.append(f"file {', '.join(self.files[task_id])} left at the platform")
        return left

    def accepted(self) -> list[dict]:
        return [s for s in self.record["submissions"] if s["status"] in ACCEPTED_STATUSES]

    def cancelled(self) -> list[dict]:
        """Tasks a cancel stopped: CANCELLED, or COMPENSATION_FAILED with the dead letter a cancel opens."""
        return [
            task
            for task in self.tasks.values()
            if task["state"] == "cancelled"
            or (
                task["state"] == "compensation_failed"
                and task["cancel_requested_at"] is not None
                and any(item["reason_code"] == CANCELLED_REASON for item in self.dlq_items.get(task["id"], []))
            )
        ]


def _by_task(items: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        grouped[item["task_id"]].append(item)
    return dict(grouped)


def _failure_notices(record: dict) -> Counter[str]:
    """Notifications sent by a task's failure notice, told from its step's by the effect key.

    Effect keys are ``rc-<task>-g<generation>-<step>-<effect>``; the notice's step name comes from its
    attempts. A failed task may also have sent its last step's notification (a timeout after the platform
    acted), which is not a second notice.
    """
    notice_steps: dict[str, set[str]] = defaultdict(set)
    for attempt in record["attempts"]:
        if attempt["kind"] == "failure_notice":
            notice_steps[attempt["task_id"]].add(attempt["step_name"])
    return Counter(
        call["task_id"]
        for call in record["calls"]
        if call["kind"] == "notification"
        and call["effect"]
        and any(f"-{step}-" in (call["idempotency_key"] or "") for step in notice_steps.get(call["task_id"], ()))
    )


def key_step(key: str | None, task_id: str, generation: int) -> str | None:
    """The step name in an effect key ``rc-<task>-g<generation>-<step>-<effect>`` of that task and generation."""
    prefix = f"rc-{task_id}-g{generation}-"
    if key is None or not key.startswith(prefix):
        return None
    # Step names are lower case, digits and _ (tasks.pipelines.pipeline.NAME_PATTERN): the first "-" ends one.
    step, _, effect = key[len(prefix) :].partition("-")
    return step if effect else None
