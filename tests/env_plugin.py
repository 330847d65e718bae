"""A pytest plugin that prepares the test environment before Django reads its settings.

Loaded with ``-p tests.env_plugin`` (see pyproject) so it runs before
pytest-django: it gives the run its own real ``redis-server`` on a free port
(tests may stop, restart and flush it without touching the machine's shared
Redis) and a secret key for the settings.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from reliability_console.local_redis import redis_server_argv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TestRedis:
    """A private redis-server process that a test can stop and start again on the same port."""

    __test__ = False  # not a test class

    def __init__(self) -> None:
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="rc-test-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(
            redis_server_argv(self.port, self.directory),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"test redis-server did not start on port {self.port}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def flushall(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(b"FLUSHALL\r\n")
            sock.recv(16)


_server: TestRedis | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    global _server
    os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-production")
    # The test client and the test servers speak plain HTTP on 127.0.0.1 (test_deploy_settings turns it on).
    os.environ.setdefault("DJANGO_SECURE_HTTPS", "0")
    os.environ.setdefault("RELIABILITY_PIPELINE_MODULES", "tasks.demo.report_pipeline,tests.pipelines")
    _server = TestRedis()
    _server.start()
    # Also stop it if pytest aborts before pytest_unconfigure (e.g. settings fail to import).
    atexit.register(_server.stop)
    os.environ["REDIS_URL"] = _server.url


def pytest_unconfigure(config) -> None:
    if _server is not None:
        _server.stop()
        shutil.rmtree(_server.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> TestRedis:
    assert _server is not None
    return _server
