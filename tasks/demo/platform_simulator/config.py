"""Start-up configuration of the simulator, and validation of fault settings and scripted fault rules."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
_RULE_KEYS = frozenset(
    _RULE_MATCH_KEYS + _RULE_ACTION_KEYS + ("times", "retry_after", "retry_after_http_date", "code", "message")
)


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
        if rule.get("retry_after_http_date") is not None:
            # Retry-After as an HTTP date (RFC 9110 allows both forms) instead of delta-seconds.
            if not isinstance(rule["retry_after_http_date"], bool):
                raise ValueError(f"{where}.retry_after_http_date must be true or false")
            clean["retry_after_http_date"] = rule["retry_after_http_date"]
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
