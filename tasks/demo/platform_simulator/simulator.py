"""The report platform simulator: its state, the /v1 operations, fault injection and the ``/_sim/`` endpoints."""

from __future__ import annotations

import copy
import itertools
import logging
import signal
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, Self

from tasks.demo.platform_simulator.api import _MUTATING, _Call, _fingerprint, _route, _Stored, _validate_body
from tasks.demo.platform_simulator.config import SimulatorConfig, _validated_faults
from tasks.demo.platform_simulator.faults import _FaultModel
from tasks.demo.platform_simulator.server import _HttpError, _json_response, _parse_json, _Response, _Server

# The package's one logger, named as when the simulator was a single module.
logger = logging.getLogger(__package__)

_REPORT_TEMPLATES = (
    "Report on {topic}: activity for {user} was steady over the last seven days.",
    "Report on {topic}: {user} saw a modest rise compared with the previous period.",
    "Report on {topic}: no anomalies were detected for {user}.",
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReportPlatformSimulator:
    """The report platform: quota charges and refunds, reports, files, notifications and work, plus fault injection."""

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
        self._server = _Server((self.config.host, self.config.port), self._handle)
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
        """A copy of balances, charges, files, notifications, reports and work (in flight: ``finished_ms`` None)."""
        with self._lock:
            return copy.deepcopy(
                {
                    "initial_balance": self.config.initial_balance,
                    "balances": self._balances,
                    "charges": self._charges,
                    "files": self._files,
                    "notifications": self._notifications,
                    "reports": self._reports,
                    "work": self._work,
                }
            )

    def faults(self) -> dict[str, Any]:
        """The current fault configuration (rules show their remaining ``times``)."""
        with self._lock:
            return self._fault_model.snapshot()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings (``FAULT_KEYS``; ``rules`` replaces the list); raises ValueError/TypeError."""
        with self._lock:
            merged = _validated_faults(self._fault_model.snapshot(), changes)
            self._fault_model.apply(merged, reseed="seed" in changes)
            return self._fault_model.snapshot()

    def reset(self, **changes: Any) -> dict[str, Any]:
        """Clear state, records, idempotency records and rules; fault settings return to the start-up config."""
        with self._lock:
            merged = _validated_faults(self.config._fault_settings(), changes)
            self._restore()
            self._fault_model.apply(merged, reseed=True)
            return self._fault_model.snapshot()

    # -- internals: state --

    def _restore(self) -> None:
        self._generation += 1
        self._seq = itertools.count(1)
        self._balances: dict[str, int] = {}
        self._charges: dict[str, dict[str, Any]] = {}
        self._files: dict[str, dict[str, Any]] = {}
        self._notifications: list[dict[str, Any]] = []
        self._reports: list[dict[str, Any]] = []
        self._work: list[dict[str, Any]] = []
        self._idempotency: dict[str, _Stored] = {}
        self._records: list[dict[str, Any]] = []
        self._fault_model = _FaultModel(_validated_faults(self.config._fault_settings(), {}))

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
        with self._lock:
            fault = self._fault_model.pick(call)
        call.fault = fault.label
        if fault.response is not None:
            return self._finish(call, fault.response)
        if fault.hang:
            self._pause(fault.hang)
        try:
            _validate_body(call.kind, body, parsed_ok, raw)
        except _HttpError as err:
            return self._finish(call, err.response())
        if call.kind == "work":
            self._work_do(call)
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

    def _work_do(self, call: _Call) -> None:
        """Do a /v1/work call's work: wait its ``ms``, visible in ``state()`` from its start (a replay does none)."""
        with self._lock:
            if (call.idempotency_key or "") in self._idempotency:
                return  # answered from the stored response by _process, at once
            call.work = {
                "work_id": f"wk_{next(self._ids):06d}",
                "task_id": call.task_id,
                "idempotency_key": call.idempotency_key,
                "ms": call.body["ms"],
                "received_ms": call.received_ms,
                "finished_ms": None,
            }
            self._work.append(call.work)
        # Outside the lock, so calls overlap as they would on a real platform; stop() wakes it.
        self._pause(call.body["ms"] / 1000)
        with self._lock:
            call.work["finished_ms"] = _now_ms()

    def _finish(self, call: _Call, response: _Response) -> _Response:
        with self._lock:
            self._record(call, response)
        return response

    def _record(self, call: _Call, response: _Response) -> None:
        call.status = response.status
        call.finished_ms = _now_ms()
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
            if user_id in self._fault_model.insufficient or balance < units:
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
        if call.kind == "work":
            # _work_do began the work unless the key had an answer, and a key with an answer never gets here.
            assert call.work is not None
            return _json_response(200, {"work_id": call.work["work_id"], "ms": call.work["ms"]}), True
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
