"""Fixtures the acceptance tests share."""

from __future__ import annotations

import pytest

from tests.trace_servers import OtlpReceiver


@pytest.fixture
def otlp_receiver():
    """An OTLP/HTTP receiver on 127.0.0.1 that keeps the spans real processes export to it."""
    made = OtlpReceiver()
    yield made
    made.stop()
