"""The test run's private redis-server (tests/env_plugin.py) starts only for a test that asks for it.

A pytest run in a subprocess reports, after each of its tests, how many times its server was started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

# The plugin is looked up once pytest has loaded it: imported before, it would not be assertion-rewritten (a warning).
PROBE = """
import json, sys
import pytest

class StartsAfterEachTest:
    def __init__(self):
        self.starts = {}

    def pytest_runtest_teardown(self, item):
        self.starts[item.path.name + "::" + item.name] = sys.modules["tests.env_plugin"]._server.starts

probe = StartsAfterEachTest()
code = pytest.main(sys.argv[1:], plugins=[probe])
print(json.dumps({"exit": int(code), "starts": probe.starts}))
"""

ASKS_FOR_REDIS = """
def test_asks_for_redis(redis_server):
    assert redis_server.ping()
"""


def pytest_run(*args: str) -> dict:
    env = dict(os.environ)
    # Its own database name, should a test of the run ever create one: never this run's test database.
    url = urlsplit(env.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/reliability_console"))
    env["DATABASE_URL"] = urlunsplit(url._replace(path=f"{url.path}_redis_probe"))
    argv = [sys.executable, "-c", PROBE, "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"), *args]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.processes
def test_unit_tests_start_no_redis_server_and_a_test_that_asks_for_one_starts_it(tmp_path):
    (tmp_path / "test_asks.py").write_text(ASKS_FOR_REDIS)

    # In the order given: the unit tests first, then the test that asks.
    run = pytest_run("tests/unit/test_json_text.py", str(tmp_path / "test_asks.py"))

    assert run["exit"] == 0
    unit = {name: starts for name, starts in run["starts"].items() if name.startswith("test_json_text.py::")}
    assert len(unit) > 1 and set(unit.values()) == {0}
    assert run["starts"]["test_asks.py::test_asks_for_redis"] == 1
