"""The fault model in force: which injected fault, if any, a /v1 call gets."""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from tasks.demo.platform_simulator.server import _HttpError, _Response

if TYPE_CHECKING:
    from tasks.demo.platform_simulator.api import _Call

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


def _retry_after_header(seconds: float, *, http_date: bool = False) -> str:
    # HTTP only allows whole seconds; round up so a client never retries early.
    if http_date:
        return formatdate(math.ceil(time.time() + seconds), usegmt=True)
    return str(math.ceil(seconds))


@dataclass
class _Fault:
    label: str | None = None
    response: _Response | None = None
    hang: float = 0.0
    slow: float = 0.0


class _FaultModel:
    """Validated fault settings and the random generator; the simulator holds its lock around every use."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.apply(settings, reseed=True)

    def apply(self, settings: dict[str, Any], *, reseed: bool) -> None:
        self.fail_rate: float = settings["fail_rate"]
        self.throttle_rate: float = settings["throttle_rate"]
        self.retry_after: float = settings["retry_after"]
        self.slow_rate: float = settings["slow_rate"]
        self.slow_seconds: float = settings["slow_seconds"]
        self.insufficient: frozenset[str] = settings["insufficient_users"]
        self.rules: list[dict[str, Any]] = settings["rules"]
        self.seed: int | None = settings["seed"]
        if reseed:
            self.rng = random.Random(self.seed)

    def snapshot(self) -> dict[str, Any]:
        """The settings as the control API shows them (rules with their remaining ``times``)."""
        return {
            "fail_rate": self.fail_rate,
            "throttle_rate": self.throttle_rate,
            "retry_after": self.retry_after,
            "slow_rate": self.slow_rate,
            "slow_seconds": self.slow_seconds,
            "insufficient_users": sorted(self.insufficient),
            "rules": copy.deepcopy(self.rules),
            "seed": self.seed,
        }

    def pick(self, call: _Call) -> _Fault:
        """The fault for one /v1 call: a matching scripted rule first, else the random rates."""
        rule = self._take_rule(call)
        draw = self.rng.random()  # drawn for every request, so a seed gives one fixed sequence
        if rule is not None:
            if "hang" in rule:
                return _Fault("scripted:hang", hang=rule["hang"])
            if "slow" in rule:
                return _Fault("scripted:slow", slow=rule["slow"])
            status = rule["status"]
            headers = {}
            if status == 429 or "retry_after" in rule:
                headers["Retry-After"] = _retry_after_header(
                    rule.get("retry_after", self.retry_after), http_date=rule.get("retry_after_http_date", False)
                )
            code = rule.get("code", _DEFAULT_CODES.get(status, "injected_error"))
            message = rule.get("message", f"injected fault: {status}")
            return _Fault(f"scripted:{status}", _HttpError(status, code, message, headers).response())
        if draw < self.fail_rate:
            return _Fault("503", _HttpError(503, "service_unavailable", "injected fault: 503").response())
        if draw < self.fail_rate + self.throttle_rate:
            headers = {"Retry-After": _retry_after_header(self.retry_after)}
            return _Fault("429", _HttpError(429, "rate_limited", "injected fault: 429", headers).response())
        if draw < self.fail_rate + self.throttle_rate + self.slow_rate:
            return _Fault("slow", slow=self.slow_seconds)
        return _Fault()

    def _take_rule(self, call: _Call) -> dict[str, Any] | None:
        user_id = call.body.get("user_id") if isinstance(call.body, dict) else None
        for rule in self.rules:
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
                self.rules.remove(rule)
            return rule
        return None
