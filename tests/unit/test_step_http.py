"""ctx.http against a real HTTP server on 127.0.0.1: headers, effect keys, timeouts, and what it refuses to send."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tasks.demo.platform_client import ReportPlatform
from tasks.exceptions import EffectRequired, StepTimeout, TransientError
from tasks.execution.classify import classify
from tasks.execution.context import StepContext, effect_key
from tasks.outbound.http import MIN_CALL_SECONDS, _shortened


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict] = []
        self.status = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        payload = json.dumps({"id": "ch_1"}).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Recorder]:
    recorder = Recorder()
    thread = threading.Thread(target=recorder.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield recorder
    recorder.shutdown()
    recorder.server_close()


def context(seconds: float = 5.0, *, deadline: datetime | None = None) -> StepContext:
    return StepContext(
        task_id=uuid.uuid4(),
        pipeline="orders",
        step="charge",
        input={},
        outputs={},
        deadline=deadline,
        call_deadline=time.time() + seconds,
        attempt=1,
        generation=0,
    )


def test_every_request_carries_the_task_and_its_deadline(server):
    ctx = context()
    ctx.http.get(server.url + "/orders/1")
    (sent,) = server.requests
    assert sent["headers"]["X-Task-Id"] == str(ctx.task_id)
    assert sent["headers"]["X-Request-Deadline"] == str(ctx.call_deadline_ms)
    assert "Idempotency-Key" not in sent["headers"]
    assert ctx.used_keys == {}


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_mutating_request_carries_its_effect_key_and_records_it(server, method):
    ctx = context()
    getattr(ctx.http, method)(server.url + "/charges", json={"order": 7}, effect="charge")
    getattr(ctx.http, method)(server.url + "/charges", json={"order": 7}, effect="charge")  # a retry in the step
    key = effect_key(ctx.task_id, 0, "charge", "charge")
    assert [r["headers"]["Idempotency-Key"] for r in server.requests] == [key, key]
    assert server.requests[0]["method"] == method.upper()
    assert ctx.used_keys == {"charge": key}


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_mutating_request_without_its_effect_is_refused_before_it_is_sent(server, method):
    ctx = context()
    with pytest.raises(EffectRequired) as refused:
        getattr(ctx.http, method)(server.url + "/charges?api_key=sk_live_secret", json={"order": 7})
    message = str(refused.value)
    assert f'ctx.http.{method}(url, ..., effect="charge")' in message
    assert "/charges" in message and "sk_live_secret" not in message
    assert server.requests == [] and ctx.used_keys == {}
    # A permanent error of the step, with its own code: never retried.
    classification = classify(refused.value)
    assert (classification.transient, classification.code) == (False, "effect_required")


def test_effect_none_opts_out_knowingly(server):
    ctx = context()
    ctx.http.post(server.url + "/ping", json={}, effect=None)
    assert "Idempotency-Key" not in server.requests[0]["headers"] and ctx.used_keys == {}


@pytest.mark.parametrize("bad", ["", 3, ("a",)])
def test_an_effect_must_be_a_name(server, bad):
    with pytest.raises(EffectRequired):
        context().http.post(server.url + "/x", effect=bad)
    assert server.requests == []


def test_a_read_names_no_effect(server):
    with pytest.raises(EffectRequired):
        context().http.get(server.url + "/x", effect="charge")
    assert server.requests == []


def test_an_explicit_idempotency_key_is_kept(server):
    ctx = context()
    ctx.http.post(server.url + "/x", effect="charge", headers={"Idempotency-Key": "mine"})
    assert server.requests[0]["headers"]["Idempotency-Key"] == "mine"


@pytest.mark.parametrize("left", [0.0, MIN_CALL_SECONDS / 2])
def test_a_request_with_too_little_time_left_is_never_sent(server, left):
    with pytest.raises(StepTimeout):
        context(left).http.post(server.url + "/charges", effect="charge")
    assert server.requests == []


def test_the_timeout_is_the_time_left_and_an_explicit_one_only_shortens_it():
    assert _shortened(None, 3.0) == 3.0
    assert _shortened(1.5, 3.0) == 1.5
    assert _shortened(60, 3.0) == 3.0
    assert _shortened((0.5, 60), 3.0) == (0.5, 3.0)
    assert _shortened((None, 1), 3.0) == (3.0, 1.0)


def test_a_silent_far_side_times_out_the_request_as_a_transient_uncertain_error():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        ctx = context(0.4)
        with pytest.raises(requests.Timeout) as timed_out:
            ctx.http.post(f"http://127.0.0.1:{silent.getsockname()[1]}/charges", effect="charge")
    classification = classify(timed_out.value)
    assert (classification.transient, classification.code, classification.effect_uncertain) == (True, "timeout", True)
    assert "charge" in ctx.used_keys  # sent, outcome unknown: recorded as uncertain if the attempt fails


def test_the_deadline_header_is_the_earlier_of_task_deadline_and_step_timeout(server):
    # The runner passes call_deadline = min(step timeout, task deadline); the header carries it in epoch ms.
    ctx = context(2.0)
    ctx.http.get(server.url + "/")
    sent = int(server.requests[0]["headers"]["X-Request-Deadline"])
    assert sent == int(ctx.call_deadline * 1000) and sent <= int((time.time() + 2.0) * 1000)


def test_the_demo_platform_client_is_built_on_ctx_http(server):
    ctx = context()
    server.status = 503
    with pytest.raises(TransientError) as failed:
        ReportPlatform(ctx, base_url=server.url).charge(user_id="u", units=1)
    assert failed.value.code == "http_503" and failed.value.effect_uncertain
    (sent,) = server.requests
    assert sent["headers"]["Idempotency-Key"] == effect_key(ctx.task_id, 0, "charge", "charge")
    assert sent["headers"]["X-Task-Id"] == str(ctx.task_id)
    assert ctx.used_keys == {"charge": sent["headers"]["Idempotency-Key"]}
