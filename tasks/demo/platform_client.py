"""HTTP client for the report platform's wire contract (see docs/getting-started.md, "The demo").

Built on ``ctx.http`` (``tasks.outbound.http``): every call sends ``X-Task-Id`` and
``X-Request-Deadline`` and uses the time left as its timeout; every POST, PUT
and DELETE names its effect, so it carries that effect's ``Idempotency-Key``
and lands in the side-effect ledger. Answers map onto the platform's own error
codes: 429, 408 and 5xx are transient, 400/402/404/409/422 permanent.
"""

from __future__ import annotations

from typing import Any

import requests

from tasks.conf import engine_settings
from tasks.exceptions import PermanentError, TransientError
from tasks.execution.context import StepContext
from tasks.outbound.http_errors import retry_after_seconds, status_effect_uncertain, status_is_transient

PERMANENT_CODES = {
    400: "bad_request",
    402: "insufficient_quota",
    404: "not_found",
    409: "conflict",
    422: "unprocessable",
}
# Never let a single call wait longer than this, whatever the deadline.
MAX_CALL_SECONDS = 120.0


class ReportPlatform:
    def __init__(self, ctx: StepContext, base_url: str | None = None) -> None:
        self.ctx = ctx
        self.base_url = (base_url or engine_settings.REPORT_PLATFORM_URL).rstrip("/")

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        effect: str | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204),
    ) -> tuple[int, Any]:
        options = {"effect": effect} if effect is not None else {}
        try:
            response = self.ctx.http.request(
                method, self.base_url + path, json=body, timeout=MAX_CALL_SECONDS, **options
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
        if status_is_transient(status):
            raise TransientError(
                f"{method} {path}: HTTP {status}: {message}",
                code=f"http_{status}",
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
                effect_uncertain=status_effect_uncertain(status),
            )
        code = PERMANENT_CODES.get(status, f"http_{status}")
        raise PermanentError(f"{method} {path}: HTTP {status}: {message}", code=code)

    # --- the contract ----------------------------------------------------------
    # Each mutating call names its effect: ctx.http sends ctx.idempotency_key(effect) and records it.
    def charge(self, *, user_id: str, units: int, effect: str = "charge") -> dict:
        return self.call("POST", "/v1/quota/charges", body={"user_id": user_id, "units": units}, effect=effect)[1]

    def refund(self, *, charge_id: str, effect: str = "refund") -> dict:
        return self.call("POST", f"/v1/quota/charges/{charge_id}/refund", body={}, effect=effect)[1]

    def create_report(self, *, user_id: str, topic: str, effect: str = "report") -> dict:
        return self.call("POST", "/v1/reports", body={"user_id": user_id, "topic": topic}, effect=effect)[1]

    def put_file(self, *, name: str, content: str, effect: str = "file") -> dict:
        return self.call("PUT", f"/v1/files/{name}", body={"content": content}, effect=effect)[1]

    def delete_file(self, *, name: str, effect: str = "delete") -> None:
        # 404 means already gone: deleting is done either way.
        self.call("DELETE", f"/v1/files/{name}", effect=effect, ok=(200, 204, 404))

    def notify(self, *, user_id: str, message: str, effect: str = "notification") -> dict:
        return self.call("POST", "/v1/notifications", body={"user_id": user_id, "message": message}, effect=effect)[1]


def _error_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('code', '')}: {error.get('message', '')}".strip(": ")
    except (ValueError, AttributeError):
        return response.text[:200]
