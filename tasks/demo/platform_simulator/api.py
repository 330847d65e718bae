"""The /v1 wire contract: routing, request validation, call records and idempotency fingerprints."""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.demo.platform_simulator.config import _is_int
from tasks.demo.platform_simulator.server import _HttpError

_MUTATING = frozenset({"POST", "PUT", "DELETE"})
# The longest one call to /v1/work may ask for (ten minutes): a typo must not pin a server thread for days.
MAX_WORK_MS = 600_000


@dataclass
class _Call:
    """One /v1 request on its way through the simulator; becomes a call record."""

    seq: int
    generation: int
    method: str
    path: str
    task_id: str | None
    idempotency_key: str | None
    received_ms: int
    body: Any
    deadline_ms: int | None = None
    kind: str | None = None
    status: int | None = None
    replayed: bool = False
    effect: bool = False
    fault: str | None = None
    late: bool = False
    finished_ms: int | None = None
    # A /v1/work call's entry in the platform's state (``work``), made when its work began.
    work: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "task_id": self.task_id,
            "idempotency_key": self.idempotency_key,
            "deadline_ms": self.deadline_ms,
            "received_ms": self.received_ms,
            "finished_ms": self.finished_ms,
            "status": self.status,
            "replayed": self.replayed,
            "effect": self.effect,
            "fault": self.fault,
            "late": self.late,
            "body": copy.deepcopy(self.body),
            "kind": self.kind,
        }


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    status: int
    body: bytes


def _route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """Map a /v1 request to its kind and path parameters, or raise 404/405."""
    parts = path.split("/")[1:]  # "/v1/a/b" -> ["v1", "a", "b"]
    candidates: list[tuple[str, str, dict[str, str]]] = []
    if parts == ["v1", "quota", "charges"]:
        candidates.append(("POST", "charge", {}))
    elif len(parts) == 5 and parts[:3] == ["v1", "quota", "charges"] and parts[3] and parts[4] == "refund":
        candidates.append(("POST", "refund", {"charge_id": urllib.parse.unquote(parts[3])}))
    elif parts == ["v1", "reports"]:
        candidates.append(("POST", "report", {}))
    elif len(parts) == 3 and parts[:2] == ["v1", "files"] and parts[2]:
        name = urllib.parse.unquote(parts[2])
        candidates += [("PUT", "file_put", {"name": name}), ("DELETE", "file_delete", {"name": name})]
    elif parts == ["v1", "notifications"]:
        candidates.append(("POST", "notification", {}))
    elif parts == ["v1", "work"]:
        candidates.append(("POST", "work", {}))
    if not candidates:
        raise _HttpError(404, "not_found", f"no such endpoint: {path}")
    for allowed, kind, params in candidates:
        if method == allowed:
            return kind, params
    allowed_methods = ", ".join(c[0] for c in candidates)
    raise _HttpError(405, "method_not_allowed", f"{method} is not allowed on {path}", {"Allow": allowed_methods})


def _require_str(body: Mapping[str, Any], name: str, *, non_empty: bool = False) -> str:
    if name not in body:
        raise _HttpError(400, "missing_field", f"field {name!r} is required")
    value = body[name]
    if not isinstance(value, str) or (non_empty and not value):
        kind = "a non-empty string" if non_empty else "a string"
        raise _HttpError(400, "invalid_field", f"field {name!r} must be {kind}")
    return value


def _validate_body(kind: str, body: Any, parsed_ok: bool, raw: bytes) -> None:
    if kind == "file_delete":
        return
    if not parsed_ok:
        raise _HttpError(400, "malformed_json", "request body is not valid JSON")
    if not raw or not isinstance(body, dict):
        raise _HttpError(400, "invalid_body", "request body must be a JSON object")
    if kind == "charge":
        _require_str(body, "user_id", non_empty=True)
        if "units" not in body:
            raise _HttpError(400, "missing_field", "field 'units' is required")
        if not _is_int(body["units"]) or body["units"] <= 0:
            raise _HttpError(400, "invalid_field", "field 'units' must be a positive integer")
    elif kind == "report":
        _require_str(body, "user_id", non_empty=True)
        _require_str(body, "topic")
    elif kind == "file_put":
        _require_str(body, "content")
    elif kind == "notification":
        _require_str(body, "user_id", non_empty=True)
        _require_str(body, "message")
    elif kind == "work":
        if "ms" not in body:
            raise _HttpError(400, "missing_field", "field 'ms' is required")
        if not _is_int(body["ms"]) or not 0 <= body["ms"] <= MAX_WORK_MS:
            raise _HttpError(400, "invalid_field", f"field 'ms' must be an integer from 0 to {MAX_WORK_MS}")


def _fingerprint(method: str, path: str, body: Any) -> str:
    return f"{method} {path} {json.dumps(body, sort_keys=True, separators=(',', ':'))}"
