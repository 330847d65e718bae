"""The demo's platform client: what it refuses to send."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from tasks.demo.platform_client import MIN_CALL_SECONDS, ReportPlatform
from tasks.exceptions import StepTimeout, TransientError


def listening_port() -> socket.socket:
    """A socket that accepts connections and never answers: a request sent there is visible as a connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    return server


@pytest.mark.parametrize("left", [0.0, MIN_CALL_SECONDS / 2])
def test_a_call_with_too_little_time_left_is_never_sent(left):
    with listening_port() as server:
        ctx = SimpleNamespace(remaining=lambda: left, call_deadline_ms=0, task_id="t")
        client = ReportPlatform(ctx, base_url=f"http://127.0.0.1:{server.getsockname()[1]}")
        with pytest.raises(StepTimeout):
            client.charge(user_id="u", units=1, key="k")
        with pytest.raises(TimeoutError):
            server.accept()  # nothing connected


def test_a_call_with_time_left_is_sent():
    with listening_port() as server:
        ctx = SimpleNamespace(remaining=lambda: MIN_CALL_SECONDS * 4, call_deadline_ms=0, task_id="t")
        client = ReportPlatform(ctx, base_url=f"http://127.0.0.1:{server.getsockname()[1]}")
        with pytest.raises(TransientError):  # sent; the silent server lets the client time out
            client.charge(user_id="u", units=1, key="k")
        connection, _ = server.accept()
        connection.close()
