"""The callback verification snippet of docs/submit-and-api.md, run as a receiver would: it accepts what we send,
nothing else."""

from __future__ import annotations

import re
import time

import pytest

from tasks.outbound.signing import body_signature_header
from tests.support import ROOT

SECRET = "whsec_receiver-test-secret"
BODY = b'{"event":"task.succeeded","task":{"id":"7","state":"succeeded"}}'


@pytest.fixture(scope="module")
def callback_verify():
    page = (ROOT / "docs" / "submit-and-api.md").read_text()
    blocks = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "def callback_verify" in block]
    assert len(blocks) == 1, "docs/submit-and-api.md shows one callback_verify snippet"
    namespace: dict = {}
    exec(compile(blocks[0], "docs/submit-and-api.md:callback_verify", "exec"), namespace)  # our own docs' code
    return namespace["callback_verify"]


def test_it_accepts_our_header(callback_verify):
    header = body_signature_header(secrets=[SECRET], body=BODY)
    assert callback_verify(secret=SECRET, header=header, raw_body=BODY)


def test_it_accepts_either_secret_during_a_rotation(callback_verify):
    header = body_signature_header(secrets=["whsec_new-one", SECRET], body=BODY)
    assert callback_verify(secret=SECRET, header=header, raw_body=BODY)
    assert callback_verify(secret="whsec_new-one", header=header, raw_body=BODY)
    assert not callback_verify(secret="whsec_third", header=header, raw_body=BODY)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda header, body: (header, body.replace(b"succeeded", b"failed")), id="tampered body"),
        pytest.param(lambda header, body: (header, body + b" "), id="a byte added"),
        pytest.param(lambda header, body: (re.sub(r"t=\d+", "t=1000", header), body), id="moved timestamp"),
        pytest.param(lambda header, body: (header.split(",")[0], body), id="no v1"),
        pytest.param(lambda header, body: ("", body), id="no header"),
    ],
)
def test_it_rejects_a_tampered_request(callback_verify, tamper):
    header, body = tamper(body_signature_header(secrets=[SECRET], body=BODY), BODY)
    assert not callback_verify(secret=SECRET, header=header, raw_body=body)


def test_it_rejects_an_old_timestamp_and_keeps_the_tolerance_window(callback_verify):
    now = int(time.time())
    old = body_signature_header(secrets=[SECRET], body=BODY, timestamp=now - 301)
    assert not callback_verify(secret=SECRET, header=old, raw_body=BODY)
    recent = body_signature_header(secrets=[SECRET], body=BODY, timestamp=now - 200)
    assert callback_verify(secret=SECRET, header=recent, raw_body=BODY)
    assert not callback_verify(secret=SECRET, header=recent, raw_body=BODY, tolerance=100)
    future = body_signature_header(secrets=[SECRET], body=BODY, timestamp=now + 301)
    assert not callback_verify(secret=SECRET, header=future, raw_body=BODY)
