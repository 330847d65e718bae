"""HTTP client for the report platform's wire contract (see README, "The demo pipeline").

Every call sends ``X-Task-Id`` and ``X-Request-Deadline`` and uses the time
left as its client timeout; every POST, PUT and DELETE sends an
``Idempotency-Key``. Answers map onto the exception hierarchy: 429, 5xx and
silence are transient, 400/402/404/409/422 permanent.
"""

from __future__ import annotations

import threading
from typing import Any

import requests
from django.conf import settings

from tasks.context import StepContext
from tasks.exceptions import PermanentError, StepTimeout, TransientError
from tasks.http_errors import retry_after_seconds

PERMANENT_CODES = {
    400: "bad_request",
    402: "insufficient_quota",
    404: "not_found",
    409: "conflict",
    422: "unprocessable",
}
# Never let a single call wait longer than this, whatever the deadline.
MAX_CALL_SECONDS = 120.0
# With less time than this left a request would reach the platform after its deadline (a loaded host takes
# milliseconds to send it) and its answer could not come back in time: it is not sent (seen in make chaos).
MIN_CALL_SECONDS = 0.05

_local = threading.local()


def _session() -> requests.Session:
    # One keep-alive session per thread: a worker reuses its connections.
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        _local.session = session
    return session


class ReportPlatform:
    def __init__(self, ctx: StepContext, base_url: str | None = None) -> None:
        self.ctx = ctx
        self.base_url = (base_url or settings.REPORT_PLATFORM_URL).rstrip("/")

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        key: str | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204),
    ) -> tuple[int, Any]:
        left = self.ctx.remaining()
        if left < MIN_CALL_SECONDS:
            # Never send a request the caller has already given up on, or one that could only arrive late.
            raise StepTimeout(f"{method} {path}: no time left before the deadline")
        headers = {
            "X-Task-Id": str(self.ctx.task_id),
            "X-Request-Deadline": str(self.ctx.call_deadline_ms),
        }
        if method in ("POST", "PUT", "DELETE", "PATCH"):
            if not key:
                raise ValueError("mutating calls need an idempotency key")
            headers["Idempotency-Key"] = key
        try:
            response = _session().request(
                method,
                self.base_url + path,
                json=body,
                headers=headers,
                timeout=min(left, MAX_CALL_SECONDS),
            )
        except requests.Timeout as exc:
            raise TransientError(f"{method} {path}: no answer in time", code="timeout") from exc
        except requests.ConnectionError as exc:
            raise TransientError(f"{method} {path}: connection failed", code="connection_error") from exc
        status = response.status_code
        if status in ok:
            return status, (response.json() if response.content else None)
        message = _error_message(response)
        if status == 429:
            raise TransientError(
                f"{method} {path}: rate limited: {message}",
                code="rate_limited",
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
                effect_uncertain=False,
            )
        if status >= 500 or status == 408:
            raise TransientError(f"{method} {path}: HTTP {status}: {message}", code=f"http_{status}")
        code = PERMANENT_CODES.get(status, f"http_{status}")
        raise PermanentError(f"{method} {path}: HTTP {status}: {message}", code=code)

    # --- the contract ----------------------------------------------------------
    def charge(self, *, user_id: str, units: int, key: str) -> dict:
        return self.call("POST", "/v1/quota/charges", body={"user_id": user_id, "units": units}, key=key)[1]

    def refund(self, *, charge_id: str, key: str) -> dict:
        return self.call("POST", f"/v1/quota/charges/{charge_id}/refund", body={}, key=key)[1]

    def create_report(self, *, user_id: str, topic: str, key: str) -> dict:
        return self.call("POST", "/v1/reports", body={"user_id": user_id, "topic": topic}, key=key)[1]

    def put_file(self, *, name: str, content: str, key: str) -> dict:
        return self.call("PUT", f"/v1/files/{name}", body={"content": content}, key=key)[1]

    def delete_file(self, *, name: str, key: str) -> None:
        # 404 means already gone: deleting is done either way.
        self.call("DELETE", f"/v1/files/{name}", key=key, ok=(200, 204, 404))

    def notify(self, *, user_id: str, message: str, key: str) -> dict:
        return self.call("POST", "/v1/notifications", body={"user_id": user_id, "message": message}, key=key)[1]


def _error_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('code', '')}: {error.get('message', '')}".strip(": ")
    except (ValueError, AttributeError):
        return response.text[:200]
