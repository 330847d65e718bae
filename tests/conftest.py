from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from tests.support import ManagedProcess, WorkerPool, manage, process_env

TESTS = Path(__file__).resolve().parent
# Every test below these folders is marked acceptance (and gets this run's Redis before it starts).
ACCEPTANCE_FOLDERS = (TESTS / "acceptance", TESTS / "browser")
# A test that uses one of these fixtures, directly or through another fixture, gets the marker (pyproject says
# what each means), so `make test-fast` selects by marker and no list of tests is kept anywhere.
MARKER_OF_FIXTURE = {
    "start_workers": "processes",
    "start_sweeper": "processes",
    "start_api_server": "processes",
    "browser_factory": "browser",
    # A fresh virtual environment with the checkout (or its wheel) pip-installed into it.
    "wheel_venv": "slow",
    "flavour_venv": "slow",
    "fresh_venv": "slow",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(folder in item.path.parents for folder in ACCEPTANCE_FOLDERS):
            item.add_marker("acceptance")
        for marker in sorted({MARKER_OF_FIXTURE[name] for name in item.fixturenames if name in MARKER_OF_FIXTURE}):
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _redis_for_acceptance(request):
    """An acceptance test's processes find Redis running, as they did when every run started it first."""
    if request.node.get_closest_marker("acceptance"):
        request.getfixturevalue("redis_server")


@pytest.fixture(autouse=True, scope="session")
def _transactional_reset_by_delete():
    """A transactional test's tables are emptied by DELETE instead of TRUNCATE (tests/database_reset.py)."""
    from django.test import TransactionTestCase

    from tests.database_reset import fixture_teardown

    with mock.patch.object(TransactionTestCase, "_fixture_teardown", fixture_teardown):
        yield


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    """Test users' passwords are hashed with few iterations (``tests.fast_passwords``); real ones never are."""
    from django.test import override_settings

    with override_settings(
        PASSWORD_HASHERS=[
            "tests.fast_passwords.FastPBKDF2PasswordHasher",
            "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        ]
    ):
        yield


@pytest.fixture(autouse=True)
def _language_reset():
    """A request in Chinese leaves Chinese active in its thread (LocaleMiddleware does not reset it afterwards):
    the next test's messages would be worded in it."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture
def clean_redis(redis_server):
    if not redis_server.ping():
        redis_server.start()
    redis_server.flushall()
    return redis_server


@pytest.fixture(scope="session")
def simulator():
    from tasks.demo.platform_simulator import ReportPlatformSimulator

    sim = ReportPlatformSimulator().start()
    yield sim
    sim.stop()


@pytest.fixture
def platform(simulator, settings):
    """The report-platform simulator over real HTTP, reset for each test."""
    simulator.reset()
    settings.REPORT_PLATFORM_URL = simulator.url
    return simulator


@pytest.fixture
def engine_env(platform, clean_redis):
    """Environment for worker and sweeper processes of one test (short leases, fast sweeps)."""

    def build(**overrides):
        values = {
            "REPORT_PLATFORM_URL": platform.url,
            "RELIABILITY_LEASE_SECONDS": 3,
            "RELIABILITY_SWEEP_INTERVAL_SECONDS": 0.5,
            "RELIABILITY_REDELIVERY_GRACE_SECONDS": 1,
            "RELIABILITY_MAX_CRASHES": 3,
            # Sweepers evaluate alert rules only in tests that ask for it.
            "RELIABILITY_ALERT_INTERVAL_SECONDS": 3600,
            # The tests' webhook receivers listen on loopback, which alert channels reach only when listed.
            "RELIABILITY_ALERT_ALLOWED_HOSTS": "127.0.0.1",
        }
        values.update(overrides)
        return process_env(**values)

    return build


@pytest.fixture
def start_workers(engine_env):
    pools: list[WorkerPool] = []

    def start(count: int = 2, *, replace_dead: bool = False, **overrides) -> WorkerPool:
        pool = WorkerPool(count, engine_env(**overrides), replace_dead=replace_dead)
        pools.append(pool)
        return pool

    yield start
    for pool in pools:
        pool.stop()


@pytest.fixture
def start_sweeper(engine_env):
    sweepers: list[ManagedProcess] = []

    def start(**overrides) -> ManagedProcess:
        sweeper = ManagedProcess("sweeper", manage("run_sweeper"), engine_env(**overrides))
        sweepers.append(sweeper)
        return sweeper

    yield start
    for sweeper in sweepers:
        sweeper.stop()


@pytest.fixture
def start_api_server(engine_env):
    from tests.support import ApiServer

    servers: list = []

    def start(extra_args=(), **overrides) -> ApiServer:
        server = ApiServer(engine_env(**overrides), extra_args=extra_args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def webhook_receiver(settings):
    """A receiver on 127.0.0.1, listed for alert channels in this process (loopback is refused unless listed)."""
    from tests.webhook_receiver import WebhookReceiver

    receiver = WebhookReceiver()
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [*settings.RELIABILITY_ALERT_ALLOWED_HOSTS, f"127.0.0.1:{receiver.port}"]
    yield receiver
    receiver.stop()


@pytest.fixture
def dns(monkeypatch):
    """Names of hosts outside this machine resolve as a test says (DNS is outside the project); others as usual."""
    import socket

    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, bytes):
            host = host.decode()
        if host in answers:
            address = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
            return real(address, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers
