"""The campaign's approvals: tasks of a pipeline that waits for a manager's signal, and the clients that send it.

A share of the tasks goes to ``report_approved`` (``chaos.pipelines``): the report's charge, then a wait for
the signal ``manager_approval``, a short durable sleep, and the report's steps, the first of which refuses to
go on when the decision was "no". Each such task's client sends the decision over the API at a moment the
plan picks: at once (mostly before the task reaches its wait: the signal is kept), once the task is seen
waiting for it, after a random delay, or never (the wait times out and the charge is refunded). Some are
rejections; some are sent a second time with the same key and payload (the first answer must come back);
some are followed by a different decision under another key (it must be refused, 409, and change nothing).
A send whose answer is lost or a 5xx goes again with its key. Every send's answer is recorded
(``Signaller.records``) for the invariants of ``chaos.wait_invariants``.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import requests

from chaos.clients import CLIENT_TIMEOUT, thread_session

APPROVAL_PIPELINE = "report_approved"
APPROVAL_SIGNAL = "manager_approval"
SLEEP_STEP = "cool_off"
# How long the wait waits, and the sleep sleeps, in the campaign's pipeline (chaos.pipelines).
APPROVAL_TIMEOUT = 8.0
SLEEP_SECONDS = 0.3
# When the client sends the decision (drawn per task, with these weights):
SIGNAL_MODES = {
    "at_once": 0.3,  # as soon as the submission is answered: mostly before the wait is reached (kept)
    "waiting": 0.35,  # once the task is seen waiting for it (or after WATCH_SECONDS, whatever it is doing)
    "after": 0.25,  # after a random delay (SIGNAL_DELAY_RANGE): before, during or after the timeout
    "never": 0.1,  # no decision: the wait times out (signal_timeout) and the pipeline compensates
}
SIGNAL_DELAY_RANGE = (0.1, 10.0)
REJECT_SHARE = 0.2  # of decisions: "no" (the pipeline stops and compensates)
REPEAT_SHARE = 0.3  # sent once more with the same key and payload: the first answer comes back
CONFLICT_SHARE = 0.15  # followed by the other decision under another key: refused (409), nothing changes
POLL_SECONDS = 0.1
WATCH_SECONDS = 20.0
MAX_SENDS = 8
# A stored signal is answered 202; the same signal again, the first answer replayed (also 202).
SIGNAL_ACCEPTED_STATUSES = frozenset({202})


@dataclass(frozen=True)
class PlannedSignal:
    mode: str  # a key of SIGNAL_MODES
    delay: float  # seconds after the answer, for the mode "after"
    approved: bool
    repeat: bool
    conflict: bool

    def payload(self, *, approved: bool | None = None) -> dict:
        decision = self.approved if approved is None else approved
        return {"approved": decision, "by": "chaos-manager", "reason": "approved" if decision else "rejected"}


def planned_signal(rng: random.Random) -> PlannedSignal:
    """One task's decision plan; a fixed number of draws whatever they give, so later draws stay put."""
    (mode,) = rng.choices(list(SIGNAL_MODES), weights=list(SIGNAL_MODES.values()))
    delay = round(rng.uniform(*SIGNAL_DELAY_RANGE), 2)
    approved = rng.random() >= REJECT_SHARE
    repeat, conflict = rng.random() < REPEAT_SHARE, rng.random() < CONFLICT_SHARE
    return PlannedSignal(mode=mode, delay=delay, approved=approved, repeat=repeat, conflict=conflict)


class Signaller:
    """Sends each approval task's decision over HTTP at its moment, from a pool of client threads."""

    def __init__(self, api_url: str, token: str, stop: threading.Event, *, threads: int = 12) -> None:
        self.url = api_url + "/api/v1/tasks/"
        self.token = token
        self.stop = stop
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._futures: list[Future] = []
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="signaller")

    def schedule(self, index: int, signal: PlannedSignal, task_id: str) -> None:
        with self._lock:
            self._futures.append(self._pool.submit(self._run, index, signal, task_id))

    def wait(self) -> None:
        """Once the submissions are all sent: until every decision was sent (each waits WATCH_SECONDS at most)."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.result()
        self._pool.shutdown()

    def _session(self) -> requests.Session:
        return thread_session(self._local, self.token)

    def _run(self, index: int, signal: PlannedSignal, task_id: str) -> None:
        if signal.mode == "never":
            return
        if signal.mode == "after":
            self.stop.wait(signal.delay)
        elif signal.mode == "waiting":
            self._await_waiting(task_id)
        if self.stop.is_set():
            return
        first = self._send(index, task_id, signal.payload(), key=f"chaos-signal-{index}", role="first")
        if first not in SIGNAL_ACCEPTED_STATUSES:
            return  # refused (the task finished first) or never answered: nothing to repeat or contradict
        if signal.repeat:
            self._send(index, task_id, signal.payload(), key=f"chaos-signal-{index}", role="repeat")
        if signal.conflict:
            other = signal.payload(approved=not signal.approved)
            self._send(index, task_id, other, key=f"chaos-signal-{index}-other", role="conflict")

    def _await_waiting(self, task_id: str) -> None:
        deadline = time.monotonic() + WATCH_SECONDS
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                response = self._session().get(self.url + task_id, timeout=CLIENT_TIMEOUT)
            except requests.RequestException:
                response = None
            if response is not None and response.status_code == 200:
                body = response.json()
                waiting = body.get("waiting") or {}
                if waiting.get("for") == "signal" or body["state"] in ("succeeded", "failed", "compensated"):
                    return
            self.stop.wait(POLL_SECONDS)

    def _send(self, index: int, task_id: str, payload: dict, *, key: str, role: str) -> int:
        sent_at = datetime.now(UTC).isoformat()
        response, status, error = None, 0, ""
        for send in range(MAX_SENDS):  # the same key and payload again after a lost answer or a 5xx
            try:
                response = self._session().post(
                    f"{self.url}{task_id}/signals/{APPROVAL_SIGNAL}",
                    json={"payload": payload},
                    headers={"Idempotency-Key": key},
                    timeout=CLIENT_TIMEOUT,
                )
            except requests.RequestException as exc:
                response, status, error = None, 0, type(exc).__name__
            else:
                status, error = response.status_code, ""
                if status < 500:
                    break
                error = response.text[:200]
            time.sleep(min(0.2 * 2**send, 2.0))
        received_at, code = None, None
        if response is not None and status in SIGNAL_ACCEPTED_STATUSES:
            received_at = response.json()["received_at"]
        elif response is not None and status < 500:
            try:
                code = (response.json().get("error") or {}).get("code")
            except ValueError:
                code = None
            error = response.text[:200]
        with self._lock:
            self.records.append(
                {
                    "request_id": f"{index}-signal-{role}",
                    "task_id": task_id,
                    "name": APPROVAL_SIGNAL,
                    "role": role,
                    "payload": payload,
                    "status": status,
                    "code": code,
                    "received_at": received_at,
                    "sent_at": sent_at,
                    "error": error,
                }
            )
        return status
