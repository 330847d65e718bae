"""A strict JSON request parser: bad input is a 4xx with a stable code, never a 500."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from ninja.parser import Parser

from tasks.api.errors import ApiError, error_response
from tasks.conf import engine_settings
from tasks.json_text import unstorable_json

# Deeper bodies are refused before Python's recursion limit could be reached.
MAX_NESTING = 64
# A chunked body is read in pieces of at most this many bytes.
READ_BYTES = 64 * 1024


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the key {json.dumps(key)} appears twice in one object")
        self.key = key


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys: a body naming one pipeline first and another after would create
    # a task of the second, while a proxy or a log reading the first saw another request.
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


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
    limit = engine_settings.MAX_REQUEST_BYTES
    return ApiError(413, "payload_too_large", f"the body must be at most {limit} bytes", {"limit": limit})


def chunked_body_read(request) -> None:
    """Give a chunked request (``Transfer-Encoding: chunked``, no ``Content-Length``) its body, or raise ``ApiError``.

    Django reads a body of unknown length as empty (a 400 for a missing
    field, whatever was sent). Servers that decode chunked bodies say so
    with ``wsgi.input_terminated`` (gunicorn does): then at most the limit
    and one byte more are read, and a body past the limit is a 413 from
    ``read_json_body`` like a declared one. Any other server's stream cannot
    be read safely without a length: 411.
    """
    meta = request.META
    if meta.get("CONTENT_LENGTH") or "chunked" not in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
        return
    if not meta.get("wsgi.input_terminated"):
        raise ApiError(411, "length_required", "send the body with a Content-Length header (this server needs one)")
    limit = engine_settings.MAX_REQUEST_BYTES
    pieces, size = [], 0
    try:
        while size <= limit:
            piece = meta["wsgi.input"].read(min(READ_BYTES, limit + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
    except Exception:  # the server's own decoding errors (gunicorn's InvalidChunkSize, NoMoreData, …)
        raise ApiError(400, "invalid_json", "the chunked body could not be read") from None
    # HttpRequest.body is the bytes it cached on its first read: the body read here, for django-ninja and
    # the parser alike. The length read (the limit + 1 for a body too large) is the declared one from now on.
    request._body = b"".join(pieces)
    meta["CONTENT_LENGTH"] = str(size)


def chunked_bodies(run: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """For ``api.add_decorator(..., mode="view")``: ``chunked_body_read`` before django-ninja reads the body."""

    @functools.wraps(run)
    def run_with_body(request, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            chunked_body_read(request)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message, exc.details)
        return run(request, *args, **kwargs)

    return run_with_body


def read_json_body(request) -> Any:
    """Check type and size, then decode: 415, 413 or 400 ``invalid_json`` on failure."""
    content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    limit = engine_settings.MAX_REQUEST_BYTES
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
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object_without_duplicates)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "the body is not valid UTF-8") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the body is nested too deeply") from None
    except DuplicateKey as exc:
        raise ApiError(400, "invalid_json", f"the body is refused: {exc}", {"key": exc.key}) from None
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
