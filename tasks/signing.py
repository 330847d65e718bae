"""Signed outbound webhooks: ``Reliability-Signature: t=<unix seconds>,v1=<hex>``.

The HMAC-SHA256 covers ``"<t>.<Idempotency-Key>.<raw body>"``. Signing the
body alone let anyone who saw one request replay it for ever; with the time
signed, a receiver refuses a request older than its tolerance window, and with
the idempotency key signed, a replay inside the window cannot pose as another
notification (the receiver drops a key it has already seen). Each attempt of
a delivery is signed afresh, with its own time and the same key. Several
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
    return f"{timestamp}.{idempotency_key}.".encode() + body


def signature_header(*, secrets: Iterable[str], body: bytes, idempotency_key: str, timestamp: int | None = None) -> str:
    """The header value signing ``body`` and ``idempotency_key`` at ``timestamp`` (now) with each secret."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    content = signed_content(timestamp=timestamp, idempotency_key=idempotency_key, body=body)
    digests = [hmac.new(secret.encode(), content, hashlib.sha256).hexdigest() for secret in secrets]
    return ",".join([f"t={timestamp}", *(f"v1={digest}" for digest in digests)])


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
    timestamp, candidates = None, []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            candidates.append(value)
    now = time.time() if now is None else now
    if timestamp is None or abs(now - timestamp) > tolerance:
        return False
    content = signed_content(timestamp=timestamp, idempotency_key=idempotency_key, body=body)
    expected = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
