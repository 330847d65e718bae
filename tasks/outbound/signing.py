"""Signed outbound webhooks: ``Reliability-Signature: t=<unix seconds>,v1=<hex>``.

Two kinds of request are signed, each an HMAC-SHA256 in the same header:

- alert webhooks (the console's) sign ``"<t>.<Idempotency-Key>.<raw body>"``
  (``signature_header``);
- completion callbacks (``tasks.outbound.callback_events``) sign ``"<t>.<raw body>"``
  (``body_signature_header``), as the callback contract of issue #13 says:
  their body names the task and the event, which is what their one
  Idempotency-Key per task and event stands for.

Signing the body alone let anyone who saw one request replay it for ever;
with the time signed, a receiver refuses a request older than its tolerance
window (and drops a key it has already seen inside it). Each attempt of a
delivery is signed afresh, with its own time and the same key. Several
``v1=`` entries may follow ``t=`` (a receiver accepts if any matches), so a
secret can be rotated by signing with both for a while.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable

SIGNATURE_HEADER = "Reliability-Signature"
# A receiver accepts a request signed at most this long before (or after) its own clock reads.
DEFAULT_TOLERANCE_SECONDS = 300


def signed_content(*, timestamp: int, idempotency_key: str, body: bytes) -> bytes:
    """What an alert webhook's signature covers."""
    return f"{timestamp}.{idempotency_key}.".encode() + body


def body_signed_content(*, timestamp: int, body: bytes) -> bytes:
    """What a completion callback's signature covers."""
    return f"{timestamp}.".encode() + body


def content_signature_header(*, secrets: Iterable[str], content: bytes, timestamp: int) -> str:
    """``t=<timestamp>,v1=<hex>[,v1=…]``: ``content`` (which must begin with the timestamp) signed with each secret."""
    digests = [hmac.new(secret.encode(), content, hashlib.sha256).hexdigest() for secret in secrets]
    return ",".join([f"t={timestamp}", *(f"v1={digest}" for digest in digests)])


def signature_header(*, secrets: Iterable[str], body: bytes, idempotency_key: str, timestamp: int | None = None) -> str:
    """The header value signing ``body`` and ``idempotency_key`` at ``timestamp`` (now) with each secret."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    content = signed_content(timestamp=timestamp, idempotency_key=idempotency_key, body=body)
    return content_signature_header(secrets=secrets, content=content, timestamp=timestamp)


def body_signature_header(*, secrets: Iterable[str], body: bytes, timestamp: int | None = None) -> str:
    """The header value of a completion callback: ``body`` signed at ``timestamp`` (now) with each secret."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    content = body_signed_content(timestamp=timestamp, body=body)
    return content_signature_header(secrets=secrets, content=content, timestamp=timestamp)


def signature_verify(
    *,
    secret: str,
    header: str,
    body: bytes,
    idempotency_key: str,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs this body and key with ``secret``, at a time within ``tolerance`` of ``now``."""
    timestamp, candidates = _parsed(header)
    now = time.time() if now is None else now
    if timestamp is None or abs(now - timestamp) > tolerance:
        return False
    content = signed_content(timestamp=timestamp, idempotency_key=idempotency_key, body=body)
    return _any_matches(secret, content, candidates)


def body_signature_verify(
    *, secret: str, header: str, body: bytes, tolerance: float = DEFAULT_TOLERANCE_SECONDS, now: float | None = None
) -> bool:
    """Whether ``header`` signs this callback body with ``secret``, at a time within ``tolerance`` of ``now``."""
    timestamp, candidates = _parsed(header)
    now = time.time() if now is None else now
    if timestamp is None or abs(now - timestamp) > tolerance:
        return False
    return _any_matches(secret, body_signed_content(timestamp=timestamp, body=body), candidates)


def _parsed(header: str) -> tuple[int | None, list[str]]:
    timestamp, candidates = None, []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            candidates.append(value)
    return timestamp, candidates


def _any_matches(secret: str, content: bytes, candidates: list[str]) -> bool:
    expected = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
