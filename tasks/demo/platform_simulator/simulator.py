"""A simulator of the external report platform, with fault injection.

Used by the demo (``make run``) and by the test suite. Standard library only: it must run with no Django
settings, in-process (``ReportPlatformSimulator(...).start()``) or as a separate process
(``manage.py run_report_platform``), which tests drive through ``SimulatorControl``.

The wire contract (paths, bodies, status codes, headers) is fixed: clients written against it must work
unchanged with any other implementation. Control endpoints live under ``/_sim/``; they are never faulted
and never recorded.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import random
import signal
import socket
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["ReportPlatformSimulator", "SimulatorConfig", "SimulatorControl", "SimulatorError"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
FAULT_KEYS = (
    "fail_rate",
    "throttle_rate",
    "retry_after",
    "slow_rate",
    "slow_seconds",
    "insufficient_users",
    "rules",
    "seed",
)
_RULE_MATCH_KEYS = ("method", "path_prefix", "task_id", "user_id")
_RULE_ACTION_KEYS = ("status", "slow", "hang")
_RULE_KEYS = frozenset(_RULE_MATCH_KEYS + _RULE_ACTION_KEYS + ("times", "retry_after", "code", "message"))
_MUTATING = frozenset({"POST", "PUT", "DELETE"})
_DEFAULT_CODES = {
    400: "bad_request",
    402: "insufficient_quota",
    404: "not_found",
    409: "conflict",
    422: "unprocessable",
    429: "rate_limited",
    500: "internal_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}
_REPORT_TEMPLATES = (
    "Report on {topic}: activity for {user} was steady over the last seven days.",
    "Report on {topic}: {user} saw a modest rise compared with the previous period.",
    "Report on {topic}: no anomalies were detected for {user}.",
)


class SimulatorError(RuntimeError):
    """A control call to a simulator failed."""


# --- configuration ------------------------------------------------------------------------------------------------


@dataclass
class SimulatorConfig:
    """Start-up configuration; ``reset()`` returns the fault settings to these values."""

    host: str = "127.0.0.1"
    port: int = 0
    fail_rate: float = 0.0
    throttle_rate: float = 0.0
    retry_after: float = 1.0
    slow_rate: float = 0.0
    slow_seconds: float = 5.0
    insufficient_users: frozenset[str] = field(default_factory=frozenset)
    initial_balance: int = 100
    seed: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` (or ``TypeError``) with one readable line when a value is invalid."""
        if not isinstance(self.host, str) or not self.host:
            raise ValueError("host must be a non-empty string")
        if not _is_int(self.port) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer between 0 and 65535, got {self.port!r}")
        if not _is_int(self.initial_balance) or self.initial_balance < 0:
            raise ValueError(f"initial_balance must be a non-negative integer, got {self.initial_balance!r}")
        _validated_faults(self._fault_settings(), {})

    def _fault_settings(self) -> dict[str, Any]:
        return {
            "fail_rate": self.fail_rate,
            "throttle_rate": self.throttle_rate,
            "retry_after": self.retry_after,
            "slow_rate": self.slow_rate,
            "slow_seconds": self.slow_seconds,
            "insufficient_users": self.insufficient_users,
            "rules": [],
            "seed": self.seed,
        }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(name: str, value: object, minimum: float, maximum: float | None = None) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


def _validated_faults(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into ``current`` fault settings, or raise ``ValueError``."""
    unknown = sorted(set(changes) - set(FAULT_KEYS))
    if unknown:
        raise ValueError(f"unknown fault setting(s): {', '.join(unknown)} (known: {', '.join(FAULT_KEYS)})")
    merged = {**current, **changes}
    for name in ("fail_rate", "throttle_rate", "slow_rate"):
        merged[name] = _number(name, merged[name], 0, 1)
    for name in ("retry_after", "slow_seconds"):
        merged[name] = _number(name, merged[name], 0)
    users = merged["insufficient_users"]
    if isinstance(users, str) or not isinstance(users, Iterable) or not all(isinstance(u, str) for u in users):
        raise ValueError("insufficient_users must be a list of user id strings")
    merged["insufficient_users"] = frozenset(users)
    if not isinstance(merged["rules"], list):
        raise TypeError("rules must be a list of rule objects")
    merged["rules"] = [_validated_rule(i, rule) for i, rule in enumerate(merged["rules"])]
    if merged["seed"] is not None and not _is_int(merged["seed"]):
        raise ValueError(f"seed must be an integer or null, got {merged['seed']!r}")
    return merged


def _validated_rule(index: int, rule: object) -> dict[str, Any]:
    where = f"rules[{index}]"
    if not isinstance(rule, Mapping):
        raise TypeError(f"{where} must be an object")
    unknown = sorted(set(rule) - _RULE_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown key(s): {', '.join(unknown)}")
    clean: dict[str, Any] = {}
    for key in _RULE_MATCH_KEYS:
        value = rule.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"{where}.{key} must be a string")
        clean[key] = value.upper() if key == "method" else value
    actions = [key for key in _RULE_ACTION_KEYS if rule.get(key) is not None]
    if len(actions) != 1:
        raise ValueError(f"{where} needs exactly one action among status, slow, hang")
    action = actions[0]
    if action == "status":
        status = rule["status"]
        if not _is_int(status) or not 400 <= status <= 599:
            raise ValueError(f"{where}.status must be an integer between 400 and 599")
        clean["status"] = status
        if rule.get("retry_after") is not None:
            clean["retry_after"] = _number(f"{where}.retry_after", rule["retry_after"], 0)
        for key in ("code", "message"):
            if rule.get(key) is not None:
                if not isinstance(rule[key], str):
                    raise ValueError(f"{where}.{key} must be a string")
                clean[key] = rule[key]
    else:
        clean[action] = _number(f"{where}.{action}", rule[action], 0)
    times = rule.get("times", 1)
    if not _is_int(times) or times < 1:
        raise ValueError(f"{where}.times must be a positive integer")
    clean["times"] = times
    return clean


# --- request plumbing ---------------------------------------------------------------------------------------------


@dataclass
class _Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def response(self) -> _Response:
        return _Response(self.status, _error_body(self.code, self.message), dict(self.headers))


def _encode(payload: object) -> bytes:
    return json.dumps(payload).encode()


def _error_body(code: str, message: str) -> bytes:
    return _encode({"error": {"code": code, "message": message}})


def _json_response(status: int, payload: object) -> _Response:
    return _Response(status, _encode(payload))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _retry_after_header(seconds: float) -> str:
    # HTTP only allows whole seconds; round up so a client never retries early.
    return str(math.ceil(seconds))


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

    def record(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "task_id": self.task_id,
            "idempotency_key": self.idempotency_key,
            "deadline_ms": self.deadline_ms,
            "received_ms": self.received_ms,
            "status": self.status,
            "replayed": self.replayed,
            "effect": self.effect,
            "fault": self.fault,
            "late": self.late,
            "body": copy.deepcopy(self.body),
            "kind": self.kind,
        }


@dataclass
class _Fault:
    label: str | None = None
    response: _Response | None = None
    hang: float = 0.0
    slow: float = 0.0


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
    if not candidates:
        raise _HttpError(404, "not_found", f"no such endpoint: {path}")
    for allowed, kind, params in candidates:
        if method == allowed:
            return kind, params
    allowed_methods = ", ".join(c[0] for c in candidates)
    raise _HttpError(405, "method_not_allowed", f"{method} is not allowed on {path}", {"Allow": allowed_methods})


def _parse_json(raw: bytes) -> tuple[Any, bool]:
    """Return ``(body, ok)``; an empty body is ``(None, True)``."""
    if not raw:
        return None, True
    try:
        return json.loads(raw), True
    except ValueError:  # also covers UnicodeDecodeError
        return None, False


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


def _fingerprint(method: str, path: str, body: Any) -> str:
    return f"{method} {path} {json.dumps(body, sort_keys=True, separators=(',', ':'))}"


# --- the simulator ------------------------------------------------------------------------------------------------


class ReportPlatformSimulator:
    """The report platform: quota charges and refunds, reports, files and notifications, plus fault injection."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.config.validate()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._signalled = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)  # never reset, so ids stay unique across reset()
        self._generation = 0
        self._restore()

    # -- lifecycle --

    def start(self) -> ReportPlatformSimulator:
        """Bind and serve in a background thread; returns self. Port 0 picks a free port."""
        if self._server is not None:
            return self
        self._stopping.clear()
        self._signalled = False
        self._server = _Server((self.config.host, self.config.port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"report-platform-simulator:{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("report platform simulator listening on %s", self.url)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, wake sleeping requests and close every connection."""
        self._stopping.set()
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        if thread is not None:
            thread.join(timeout)
        server.server_close()
        server.close_connections(timeout)

    def serve_forever(self) -> None:
        """Serve until ``stop()``, SIGINT or SIGTERM (signals are handled only on the main thread)."""
        self.start()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            # A plain flag, not Event.set(): a signal handler must not take locks the main thread may hold.
            while not self._signalled and not self._stopping.is_set():
                time.sleep(0.1)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signalled = True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the configured one before ``start()``)."""
        if self._server is None:
            return self.config.port
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL clients should use, e.g. ``http://127.0.0.1:8765``."""
        host = self.config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # -- in-process accessors --

    def calls(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """Records of /v1 calls in arrival order, optionally only those of one task."""
        with self._lock:
            records = [copy.deepcopy(r) for r in self._records if task_id is None or r["task_id"] == task_id]
        return sorted(records, key=lambda r: r["seq"])

    def state(self) -> dict[str, Any]:
        """A copy of balances, charges, files, notifications and reports."""
        with self._lock:
            return copy.deepcopy(
                {
                    "initial_balance": self.config.initial_balance,
                    "balances": self._balances,
                    "charges": self._charges,
                    "files": self._files,
                    "notifications": self._notifications,
                    "reports": self._reports,
                }
            )

    def faults(self) -> dict[str, Any]:
        """The current fault configuration (rules show their remaining ``times``)."""
        with self._lock:
            return self._faults_snapshot()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings (``FAULT_KEYS``; ``rules`` replaces the list); raises ValueError/TypeError."""
        with self._lock:
            merged = _validated_faults(self._faults_snapshot(), changes)
            self._apply_faults(merged, reseed="seed" in changes)
            return self._faults_snapshot()

    def reset(self, **changes: Any) -> dict[str, Any]:
        """Clear state, records, idempotency records and rules; fault settings return to the start-up config."""
        with self._lock:
            merged = _validated_faults(self.config._fault_settings(), changes)
            self._restore()
            self._apply_faults(merged, reseed=True)
            return self._faults_snapshot()

    # -- internals: state --

    def _restore(self) -> None:
        self._generation += 1
        self._seq = itertools.count(1)
        self._balances: dict[str, int] = {}
        self._charges: dict[str, dict[str, Any]] = {}
        self._files: dict[str, dict[str, Any]] = {}
        self._notifications: list[dict[str, Any]] = []
        self._reports: list[dict[str, Any]] = []
        self._idempotency: dict[str, _Stored] = {}
        self._records: list[dict[str, Any]] = []
        self._apply_faults(_validated_faults(self.config._fault_settings(), {}), reseed=True)

    def _apply_faults(self, settings: dict[str, Any], *, reseed: bool) -> None:
        self._fail_rate: float = settings["fail_rate"]
        self._throttle_rate: float = settings["throttle_rate"]
        self._retry_after: float = settings["retry_after"]
        self._slow_rate: float = settings["slow_rate"]
        self._slow_seconds: float = settings["slow_seconds"]
        self._insufficient: frozenset[str] = settings["insufficient_users"]
        self._rules: list[dict[str, Any]] = settings["rules"]
        self._seed: int | None = settings["seed"]
        if reseed:
            self._rng = random.Random(self._seed)

    def _faults_snapshot(self) -> dict[str, Any]:
        return {
            "fail_rate": self._fail_rate,
            "throttle_rate": self._throttle_rate,
            "retry_after": self._retry_after,
            "slow_rate": self._slow_rate,
            "slow_seconds": self._slow_seconds,
            "insufficient_users": sorted(self._insufficient),
            "rules": copy.deepcopy(self._rules),
            "seed": self._seed,
        }

    def _pause(self, seconds: float) -> None:
        # Interruptible, so stop() never waits for an injected delay.
        self._stopping.wait(seconds)

    # -- internals: request handling --

    def _handle(self, method: str, target: str, headers: Mapping[str, str], raw: bytes, host: str) -> _Response:
        """Answer one HTTP request (called by the server's handler threads)."""
        split = urllib.parse.urlsplit(target)
        if split.path.startswith("/_sim/"):
            return self._control(method, split.path, split.query, raw)
        if split.path == "/v1" or split.path.startswith("/v1/"):
            return self._api(method, split.path, headers, raw, host)
        return _HttpError(404, "not_found", f"no such endpoint: {split.path}").response()

    def _api(self, method: str, path: str, headers: Mapping[str, str], raw: bytes, host: str) -> _Response:
        received_ms = _now_ms()
        body, parsed_ok = _parse_json(raw)
        with self._lock:
            call = _Call(
                seq=next(self._seq),
                generation=self._generation,
                method=method,
                path=path,
                task_id=headers.get("X-Task-Id"),
                idempotency_key=headers.get("Idempotency-Key"),
                received_ms=received_ms,
                body=body,
            )
        try:
            call.kind, params = _route(method, path)
            self._check_headers(call, headers)
            if received_ms > (call.deadline_ms or 0):
                call.late = True
                raise _HttpError(504, "deadline_exceeded", f"request arrived {received_ms - call.deadline_ms} ms late")
        except _HttpError as err:
            return self._finish(call, err.response())
        fault = self._pick_fault(call)
        call.fault = fault.label
        if fault.response is not None:
            return self._finish(call, fault.response)
        if fault.hang:
            self._pause(fault.hang)
        try:
            _validate_body(call.kind, body, parsed_ok, raw)
        except _HttpError as err:
            return self._finish(call, err.response())
        response = self._process(call, params, host)
        if fault.slow:
            self._pause(fault.slow)
        return response

    def _check_headers(self, call: _Call, headers: Mapping[str, str]) -> None:
        if not call.task_id:
            raise _HttpError(400, "missing_task_id", "header X-Task-Id is required")
        raw_deadline = headers.get("X-Request-Deadline")
        if raw_deadline is None or not raw_deadline.strip():
            raise _HttpError(400, "missing_deadline", "header X-Request-Deadline is required")
        try:
            call.deadline_ms = int(raw_deadline.strip())
        except ValueError:
            raise _HttpError(
                400, "invalid_deadline", f"X-Request-Deadline must be unix epoch milliseconds, got {raw_deadline!r}"
            ) from None
        if call.method in _MUTATING and not call.idempotency_key:
            raise _HttpError(400, "missing_idempotency_key", f"header Idempotency-Key is required on {call.method}")

    def _pick_fault(self, call: _Call) -> _Fault:
        with self._lock:
            rule = self._take_rule(call)
            draw = self._rng.random()  # drawn for every request, so a seed gives one fixed sequence
            if rule is not None:
                if "hang" in rule:
                    return _Fault("scripted:hang", hang=rule["hang"])
                if "slow" in rule:
                    return _Fault("scripted:slow", slow=rule["slow"])
                status = rule["status"]
                headers = {}
                if status == 429:
                    headers["Retry-After"] = _retry_after_header(rule.get("retry_after", self._retry_after))
                code = rule.get("code", _DEFAULT_CODES.get(status, "injected_error"))
                message = rule.get("message", f"injected fault: {status}")
                return _Fault(f"scripted:{status}", _HttpError(status, code, message, headers).response())
            if draw < self._fail_rate:
                return _Fault("503", _HttpError(503, "service_unavailable", "injected fault: 503").response())
            if draw < self._fail_rate + self._throttle_rate:
                headers = {"Retry-After": _retry_after_header(self._retry_after)}
                return _Fault("429", _HttpError(429, "rate_limited", "injected fault: 429", headers).response())
            if draw < self._fail_rate + self._throttle_rate + self._slow_rate:
                return _Fault("slow", slow=self._slow_seconds)
            return _Fault()

    def _take_rule(self, call: _Call) -> dict[str, Any] | None:
        user_id = call.body.get("user_id") if isinstance(call.body, dict) else None
        for rule in self._rules:
            if "method" in rule and rule["method"] != call.method:
                continue
            if "path_prefix" in rule and not call.path.startswith(rule["path_prefix"]):
                continue
            if "task_id" in rule and rule["task_id"] != call.task_id:
                continue
            if "user_id" in rule and rule["user_id"] != user_id:
                continue
            rule["times"] -= 1
            if rule["times"] <= 0:
                self._rules.remove(rule)
            return rule
        return None

    def _finish(self, call: _Call, response: _Response) -> _Response:
        with self._lock:
            self._record(call, response)
        return response

    def _record(self, call: _Call, response: _Response) -> None:
        call.status = response.status
        if call.generation == self._generation:
            self._records.append(call.record())

    def _process(self, call: _Call, params: dict[str, str], host: str) -> _Response:
        fingerprint = _fingerprint(call.method, call.path, call.body)
        key = call.idempotency_key or ""
        with self._lock:
            if call.generation != self._generation:
                # Arrived before a reset() and woke after it: it must not leak into the fresh state.
                return _HttpError(503, "simulator_reset", "the simulator was reset while this call waited").response()
            stored = self._idempotency.get(key)
            if stored is not None and stored.fingerprint != fingerprint:
                response = _HttpError(
                    422, "idempotency_key_reused", "this Idempotency-Key was used with a different request"
                ).response()
            elif stored is not None:
                call.replayed = True
                response = _Response(stored.status, stored.body, {"Idempotent-Replayed": "true"})
            else:
                try:
                    response, call.effect = self._apply(call, params, host)
                except _HttpError as err:
                    response = err.response()
                self._idempotency[key] = _Stored(fingerprint, response.status, response.body)
            self._record(call, response)
            return response

    def _apply(self, call: _Call, params: dict[str, str], host: str) -> tuple[_Response, bool]:
        """Perform one business operation (lock held); returns the response and whether state changed."""
        body = call.body
        task_id = call.task_id
        if call.kind == "charge":
            user_id, units = body["user_id"], body["units"]
            balance = self._balances.get(user_id, self.config.initial_balance)
            if user_id in self._insufficient or balance < units:
                raise _HttpError(402, "insufficient_quota", f"user {user_id!r} has {balance} units, {units} requested")
            charge_id = f"ch_{next(self._ids):06d}"
            self._balances[user_id] = balance - units
            self._charges[charge_id] = {"user_id": user_id, "units": units, "refunded": False, "task_id": task_id}
            return _json_response(201, {"charge_id": charge_id, "balance": balance - units}), True
        if call.kind == "refund":
            charge = self._charges.get(params["charge_id"])
            if charge is None:
                raise _HttpError(404, "charge_not_found", f"no such charge: {params['charge_id']}")
            user_id = charge["user_id"]
            balance = self._balances.get(user_id, self.config.initial_balance)
            if charge["refunded"]:
                return _json_response(200, {"balance": balance}), False
            charge["refunded"] = True
            self._balances[user_id] = balance + charge["units"]
            return _json_response(200, {"balance": balance + charge["units"]}), True
        if call.kind == "report":
            number = next(self._ids)
            report_id = f"rep_{number:06d}"
            template = _REPORT_TEMPLATES[number % len(_REPORT_TEMPLATES)]
            text = template.format(topic=body["topic"], user=body["user_id"])
            report = {"report_id": report_id, "user_id": body["user_id"], "topic": body["topic"], "text": text}
            self._reports.append({**report, "task_id": task_id})
            return _json_response(200, {"report_id": report_id, "text": text}), True
        if call.kind == "file_put":
            name = params["name"]
            self._files[name] = {"content": body["content"], "task_id": task_id}
            url = f"http://{host or self.url.removeprefix('http://')}/v1/files/{urllib.parse.quote(name, safe='')}"
            return _json_response(201, {"url": url}), True
        if call.kind == "file_delete":
            if params["name"] not in self._files:
                raise _HttpError(404, "file_not_found", f"no such file: {params['name']}")
            del self._files[params["name"]]
            return _Response(204), True
        if call.kind == "notification":
            notification_id = f"ntf_{next(self._ids):06d}"
            notification = {"notification_id": notification_id, "user_id": body["user_id"], "message": body["message"]}
            self._notifications.append({**notification, "task_id": task_id})
            return _json_response(202, {"notification_id": notification_id}), True
        raise AssertionError(f"unrouted kind {call.kind!r}")

    def _control(self, method: str, path: str, query: str, raw: bytes) -> _Response:
        endpoints = {
            "/_sim/health": "GET",
            "/_sim/calls": "GET",
            "/_sim/state": "GET",
            "/_sim/faults": "POST",
            "/_sim/reset": "POST",
        }
        if path not in endpoints:
            return _HttpError(404, "not_found", f"no such control endpoint: {path}").response()
        if method != endpoints[path]:
            return _HttpError(
                405, "method_not_allowed", f"{method} is not allowed on {path}", {"Allow": endpoints[path]}
            ).response()
        if path == "/_sim/health":
            return _json_response(200, {"ok": True})
        if path == "/_sim/calls":
            task_ids = urllib.parse.parse_qs(query).get("task_id")
            return _json_response(200, {"calls": self.calls(task_ids[0] if task_ids else None)})
        if path == "/_sim/state":
            return _json_response(200, self.state())
        body, parsed_ok = _parse_json(raw)
        if not parsed_ok or not isinstance(body if raw else {}, dict):
            return _HttpError(400, "invalid_body", "request body must be a JSON object").response()
        try:
            if path == "/_sim/faults":
                return _json_response(200, self.set_faults(**(body or {})))
            return _json_response(200, {"ok": True, "faults": self.reset(**(body or {}))})
        except (TypeError, ValueError) as exc:
            return _HttpError(400, "invalid_faults", str(exc)).response()


# --- HTTP server --------------------------------------------------------------------------------------------------


class _BadFraming(Exception):
    pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], simulator: ReportPlatformSimulator) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.simulator = simulator
        self._connections: set[socket.socket] = set()
        self._connections_changed = threading.Condition()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can stall for seconds.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("report platform simulator: error serving %s", client_address, exc_info=sys.exc_info())

    def track(self, connection: socket.socket) -> None:
        with self._connections_changed:
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._connections_changed:
            self._connections.discard(connection)
            self._connections_changed.notify_all()

    def close_connections(self, timeout: float) -> None:
        """Shut down open (e.g. idle keep-alive) connections and wait for their threads to finish."""
        with self._connections_changed:
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections_changed.wait_for(lambda: not self._connections, timeout)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ReportPlatformSimulator/1.0"
    timeout = 120  # an idle keep-alive connection must not pin a thread forever
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("report platform simulator: %s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            raw = self._read_body()
        except _BadFraming as exc:
            self._write(_Response(400, _error_body("invalid_body", str(exc)), close=True))
            return
        except OSError:
            self.close_connection = True
            return
        headers = {name: self.headers[name] for name in ("X-Task-Id", "X-Request-Deadline", "Idempotency-Key")}
        headers = {name: value for name, value in headers.items() if value is not None}
        response = self.server.simulator._handle(self.command, self.path, headers, raw, self.headers.get("Host", ""))
        self._write(response)

    def _read_body(self) -> bytes:
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise _BadFraming(f"unsupported Transfer-Encoding: {encoding}")
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
        except ValueError:
            raise _BadFraming(f"invalid Content-Length: {length!r}") from None
        if not 0 <= size <= MAX_BODY_BYTES:
            raise _BadFraming(f"Content-Length must be between 0 and {MAX_BODY_BYTES}")
        raw = self.rfile.read(size)
        if len(raw) != size:
            raise _BadFraming("request body shorter than Content-Length")
        return raw

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _BadFraming("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise _BadFraming(f"request body larger than {MAX_BODY_BYTES} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise _BadFraming("truncated chunked body")
            chunks.append(chunk)
            self.rfile.readline(1024)

    def _write(self, response: _Response) -> None:
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            if response.status != 204:  # a 204 carries neither a body nor Content-Length (RFC 9110)
                if response.body:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(response.body)))
            if response.close:
                self.send_header("Connection", "close")
            self.end_headers()
            if response.body and response.status != 204:
                self.wfile.write(response.body)
        except OSError:
            # The client gave up (e.g. timed out on a slow answer); nothing left to tell it.
            self.close_connection = True


# --- control client -----------------------------------------------------------------------------------------------


class SimulatorControl:
    """Drive a simulator running in another process through its ``/_sim/`` endpoints."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Never route a local control call through an http_proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def health(self) -> bool:
        """True when the simulator answers ``/_sim/health``."""
        try:
            return bool(self._request("GET", "/_sim/health", timeout=min(self.timeout, 1.0)).get("ok"))
        except (SimulatorError, OSError):
            return False

    def wait_healthy(self, timeout: float = 10.0) -> None:
        """Poll until healthy; raise ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"report platform simulator at {self.base_url} not healthy after {timeout}s")
            time.sleep(0.05)

    def calls(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """Call records, optionally for one task."""
        query = "?" + urllib.parse.urlencode({"task_id": task_id}) if task_id is not None else ""
        return self._request("GET", "/_sim/calls" + query)["calls"]

    def state(self) -> dict[str, Any]:
        """Balances, charges, files, notifications and reports."""
        return self._request("GET", "/_sim/state")

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings; returns the new configuration."""
        if "insufficient_users" in changes:
            changes["insufficient_users"] = sorted(changes["insufficient_users"])
        return self._request("POST", "/_sim/faults", changes)

    def reset(self, **changes: Any) -> dict[str, Any]:
        """Clear everything; returns the fault configuration in force afterwards."""
        if "insufficient_users" in changes:
            changes["insufficient_users"] = sorted(changes["insufficient_users"])
        return self._request("POST", "/_sim/reset", changes)["faults"]

    def _request(self, method: str, path: str, body: object = None, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read().decode(errors="replace")
            finally:
                exc.close()
            raise SimulatorError(f"{method} {path} -> {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise SimulatorError(f"{method} {path} failed: {exc.reason}") from None
