"""A pytest plugin that prepares the test environment before Django reads its settings.

Loaded with ``-p tests.env_plugin`` (see pyproject) so it runs before
pytest-django: it gives the run its own real ``redis-server`` on a free port
(tests may stop, restart and flush it without touching the machine's shared
Redis) and a secret key for the settings.

The port and ``REDIS_URL`` are chosen here, because the settings read them at
start-up, but the server starts only when a test asks for it (the
``redis_server`` fixture, or ``clean_redis``, which uses it): a run of unit
tests starts none. Until then the port stays bound but not listening, so a
test that touches Redis without asking is refused at once instead of reaching
whatever else took the port.
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
        # Held (bound, never listening) until the first start: connections are refused and no other
        # process of the run (a simulator, a live server, a free_port()) is given this port.
        self._reservation: socket.socket | None = socket.socket()
        self._reservation.bind(("127.0.0.1", 0))
        self.port = self._reservation.getsockname()[1]
        self.directory = tempfile.mkdtemp(prefix="rc-test-redis-")
        self.process: subprocess.Popen | None = None
        self.starts = 0  # how many times this run started the server (tests/unit/test_redis_on_demand.py reads it)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.release_port()
        self.starts += 1
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

    def release_port(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None

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

# Added to the report of a test that failed on a refused Redis connection before any test started the server.
NOT_STARTED = (
    "This run's redis-server was never started: it starts for a test that asks for it. "
    "Give the test the clean_redis fixture (an empty Redis) or redis_server (the server as it is)."
)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    global _server
    os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-production")
    # The test client and the test servers speak plain HTTP on 127.0.0.1 (test_deploy_settings turns it on).
    os.environ.setdefault("DJANGO_SECURE_HTTPS", "0")
    os.environ.setdefault("RELIABILITY_PIPELINE_MODULES", "tasks.demo.report_pipeline,tests.pipelines")
    _server = TestRedis()
    # Also stop it if pytest aborts before pytest_unconfigure (e.g. settings fail to import).
    atexit.register(_server.stop)
    os.environ["REDIS_URL"] = _server.url


def pytest_unconfigure(config) -> None:
    if _server is not None:
        _server.stop()
        _server.release_port()
        shutil.rmtree(_server.directory, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    never_started = _server is not None and _server.starts == 0
    if call.excinfo is not None and never_started and _refused_by_redis(call.excinfo.value):
        report.sections.append(("test Redis", NOT_STARTED))
    return report


def _refused_by_redis(error: BaseException | None) -> bool:
    from redis.exceptions import ConnectionError as RedisConnectionError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, RedisConnectionError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@pytest.fixture(scope="session")
def redis_server() -> TestRedis:
    """This run's private redis-server, started on first use and left running for the rest of the run."""
    assert _server is not None
    if _server.starts == 0:
        _server.start()
    return _server
