"""Outbound webhook signatures: alert webhooks sign time, key and body; completion callbacks time and body."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from tasks.outbound.signing import body_signature_header, body_signature_verify, signature_header, signature_verify

BODY = b'{"a":1}'
KEY = "alert-7-hook"


def header_at(timestamp: int, secrets=("s3cret",), key: str = KEY, body: bytes = BODY) -> str:
    return signature_header(secrets=list(secrets), body=body, idempotency_key=key, timestamp=timestamp)


def test_the_header_is_t_and_v1_over_time_key_and_body():
    header = header_at(1_700_000_000)
    expected = hmac.new(b"s3cret", b"1700000000." + KEY.encode() + b"." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"


def test_a_fresh_signature_verifies():
    assert signature_verify(secret="s3cret", header=header_at(1000), body=BODY, idempotency_key=KEY, now=1010)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"now": 1000 + 301}, "replayed after the tolerance window"),
        ({"now": 1000 - 301}, "signed in the future"),
        ({"secret": "other"}, "another secret"),
        ({"body": b'{"a":2}'}, "another body"),
        ({"idempotency_key": "alert-8-hook"}, "another notification's key"),
        ({"header": "t=1000"}, "no v1"),
        ({"header": "v1=abc"}, "no t"),
        ({"header": ""}, "no header"),
        ({"header": header_at(1000).replace("t=1000", "t=1200")}, "a moved timestamp"),
        ({"header": "t=abc," + header_at(1000).split(",")[1]}, "a timestamp that is not a number"),
    ],
)
def test_a_signature_is_refused_when(change, why):
    arguments = {"secret": "s3cret", "header": header_at(1000), "body": BODY, "idempotency_key": KEY, "now": 1000}
    assert not signature_verify(**{**arguments, **change}), why


def test_during_a_rotation_either_secret_verifies():
    header = header_at(1000, secrets=("old", "new"))
    assert header.count("v1=") == 2
    for secret in ("old", "new"):
        assert signature_verify(secret=secret, header=header, body=BODY, idempotency_key=KEY, now=1000)
    assert not signature_verify(secret="third", header=header, body=BODY, idempotency_key=KEY, now=1000)


# --- completion callbacks: "<t>.<raw body>" ------------------------------------------------------


def test_a_callback_header_is_t_and_v1_over_time_and_body_only():
    header = body_signature_header(secrets=["s3cret"], body=BODY, timestamp=1_700_000_000)
    expected = hmac.new(b"s3cret", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    # Not interchangeable with an alert webhook's signature of the same body.
    assert header != header_at(1_700_000_000)


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({}, True),
        ({"now": 1000 + 300}, True),
        ({"now": 1000 + 301}, False),
        ({"secret": "other"}, False),
        ({"body": b'{"a":2}'}, False),
        ({"header": signature_header(secrets=["s3cret"], body=BODY, idempotency_key=KEY, timestamp=1000)}, False),
    ],
)
def test_a_callback_signature_verifies_only_as_signed(change, valid):
    header = body_signature_header(secrets=["old", "s3cret"], body=BODY, timestamp=1000)
    arguments = {"secret": "s3cret", "header": header, "body": BODY, "now": 1000, **change}
    assert body_signature_verify(**arguments) is valid
