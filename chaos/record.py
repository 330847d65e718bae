"""The recorded run of a chaos campaign: its format and its structural validation.

A recorded run is an object with these sections. The fields listed are the ones the checker reads and
requires; any other field (a submission's body, a task's input or failure) is kept for people reading it::

    meta         {"seed", "tasks", "workers", "max_crashes",
                  "policies": {pipeline: {"max_attempts", "compensation_max_attempts"}}}
    faults       [{"kind", "at", "detail"}]                       what the campaign did to the deployment
    submissions  [{"request_id", "idempotency_key", "status", "task_id", "replayed"}]   status 0: no answer
    tasks        [{"id", "pipeline", "state", "generation", "idempotency_key"}]
    dlq_items    [{"task_id", "status", "reason_code"}]
    attempts     [{"task_id", "kind", "generation", "step_index", "step_name", "attempt", "outcome"}]
    calls        ReportPlatformSimulator.calls(), unchanged
    platform     ReportPlatformSimulator.state(), unchanged

States, statuses, kinds and outcomes are the values of tasks.models and dlq.models (a unit test keeps the
copies below in step with them).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["RecordError", "validate_record"]

TERMINAL_STATES = frozenset({"succeeded", "failed", "compensated", "compensation_failed", "cancelled"})
# Failed for good: each has its dead letter (a cancelled task has one only when its compensation failed).
NOT_SUCCEEDED_STATES = frozenset({"failed", "compensated", "compensation_failed"})
TASK_STATES = TERMINAL_STATES | {"queued", "running", "retry_scheduled", "compensating"}
UNRESOLVED_DLQ_STATUSES = frozenset({"open", "retrying", "compensating", "compensated"})
DLQ_STATUSES = UNRESOLVED_DLQ_STATUSES | {"resolved"}
ATTEMPT_KINDS = frozenset({"step", "compensation", "failure_notice"})
ATTEMPT_OUTCOMES = frozenset(
    {"succeeded", "transient_error", "permanent_error", "timeout", "crashed", "deadline_exceeded", "cancelled"}
)
# The API answers a new task with 201 and replays that answer for a repeated key; 200 would be a success too.
ACCEPTED_STATUSES = frozenset({200, 201})
# Only the demo report pipeline acts on the report platform; other pipelines have no effects to check.
PLATFORM_PIPELINE = "report"
# Under a failing invariant the table shows this many violations and counts the rest.
VIOLATIONS_SHOWN = 5


class RecordError(ValueError):
    """A recorded run that is not structurally valid; the message is one readable line."""


# --- structure ------------------------------------------------------------------------------------------------------

_NONE = type(None)
_STR, _OPT_STR, _INT, _OPT_INT, _BOOL, _NUMBER = (str,), (str, _NONE), (int,), (int, _NONE), (bool,), (float,)
_SECTIONS = {
    "meta": dict,
    "faults": list,
    "submissions": list,
    "tasks": list,
    "dlq_items": list,
    "attempts": list,
    "calls": list,
    "platform": dict,
}
_META_FIELDS = {"seed": _INT, "tasks": _INT, "workers": _INT, "max_crashes": _INT, "policies": (dict,)}
_POLICY_FIELDS = {"max_attempts": _INT, "compensation_max_attempts": _INT}
_ITEM_FIELDS = {
    "faults": {"kind": _STR, "at": _NUMBER, "detail": _STR},
    "submissions": {
        "request_id": _STR,
        "idempotency_key": _OPT_STR,
        "status": _INT,
        "task_id": _OPT_STR,
        "replayed": _BOOL,
    },
    "tasks": {"id": _STR, "pipeline": _STR, "state": _STR, "generation": _INT, "idempotency_key": _OPT_STR},
    "dlq_items": {"task_id": _STR, "status": _STR, "reason_code": _STR},
    "attempts": {
        "task_id": _STR,
        "kind": _STR,
        "generation": _INT,
        "step_index": _INT,
        "step_name": _STR,
        "attempt": _INT,
        "outcome": _STR,
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
}
_CHOICES = {
    "tasks": {"state": TASK_STATES},
    "dlq_items": {"status": DLQ_STATUSES},
    "attempts": {"kind": ATTEMPT_KINDS, "outcome": ATTEMPT_OUTCOMES},
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
    _fields(record["meta"], _META_FIELDS, "meta")
    for pipeline, policy in record["meta"]["policies"].items():
        where = f"meta.policies.{pipeline}"
        _fields(policy, _POLICY_FIELDS, where)
        for name in _POLICY_FIELDS:
            if policy[name] < 1:
                raise RecordError(f"{where}.{name}: must be at least 1, got {policy[name]}")
    for section, fields in _ITEM_FIELDS.items():
        for index, item in enumerate(record[section]):
            where = f"{section}[{index}]"
            _fields(item, fields, where)
            for name, allowed in _CHOICES.get(section, {}).items():
                if item[name] not in allowed:
                    raise RecordError(
                        f"{where}.{name}: expected one of {', '.join(sorted(allowed))}, got {item[name]!r}"
                    )
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


# --- the run, indexed -----------------------------------------------------------------------------------------------
