"""Redact secrets from payloads before they are stored in the DLQ or shown to anyone."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from django.conf import settings

REDACTED = "[redacted]"
# Nested payloads deeper than this are cut rather than walked.
MAX_DEPTH = 32


@lru_cache(maxsize=8)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def redact(value: Any, pattern: str | None = None, _depth: int = 0) -> Any:
    """Return a copy of ``value`` with the values of secret-looking keys replaced."""
    regex = _compiled(pattern if pattern is not None else settings.RELIABILITY_REDACT_PATTERN)
    if _depth > MAX_DEPTH:
        return REDACTED
    if isinstance(value, dict):
        return {
            key: REDACTED if regex.search(str(key)) else redact(item, pattern, _depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(item, pattern, _depth + 1) for item in value]
    return value
