"""A strict JSON request parser: bad input is a 4xx with a stable code, never a 500."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from ninja.parser import Parser

from tasks.api.errors import ApiError
from tasks.json_text import unstorable_json

# Deeper bodies are refused before Python's recursion limit could be reached.
MAX_NESTING = 64


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _depth(value: Any, limit: int) -> int:
    depth, frontier = 0, [value]
    while frontier:
        depth += 1
        if depth > limit:
            return depth
        nxt = []
        for item in frontier:
            if isinstance(item, dict):
                nxt.extend(item.values())
            elif isinstance(item, list):
                nxt.extend(item)
        frontier = nxt
    return depth


def payload_too_large() -> ApiError:
    """The 413 of a body past ``RELIABILITY_MAX_REQUEST_BYTES``, however it was found too large."""
    limit = settings.RELIABILITY_MAX_REQUEST_BYTES
    return ApiError(413, "payload_too_large", f"the body must be at most {limit} bytes", {"limit": limit})


def read_json_body(request) -> Any:
    """Check type and size, then decode: 415, 413 or 400 ``invalid_json`` on failure."""
    content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    limit = settings.RELIABILITY_MAX_REQUEST_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "invalid_json", "Content-Length is not a number") from None
    if declared > limit:
        raise payload_too_large()
    body = request.body
    if len(body) > limit:
        raise payload_too_large()
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "the body is not valid UTF-8") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers too long to convert
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if _depth(value, MAX_NESTING) > MAX_NESTING:
        raise ApiError(400, "invalid_json", f"the body is nested deeper than {MAX_NESTING} levels")
    problem = unstorable_json(text, value)
    if problem:
        raise ApiError(400, "validation_error", f"the body holds {problem}, which cannot be stored", {"body": problem})
    return value


class StrictJsonParser(Parser):
    def parse_body(self, request) -> Any:
        return read_json_body(request)
