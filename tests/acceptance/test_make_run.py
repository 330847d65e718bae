"""`make run` as a new user would run it: no DATABASE_URL, no REDIS_URL, a fresh state directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.env_plugin import free_port
from tests.support import ROOT

pytestmark = pytest.mark.acceptance


def test_make_run_reaches_a_working_console_and_settles_the_demo(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY")}
    env.pop("RELIABILITY_PIPELINE_MODULES", None)
    env.update({"RELIABILITY_VAR_DIR": str(tmp_path / "var"), "PORT": str(free_port())})
    result = subprocess.run(
        [sys.executable, "scripts/run_local.py", "--exit-when-settled", "--settle-timeout", "180"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"password: \S{12,}", result.stdout)
    settled = json.loads(result.stdout.split("demo tasks settled: ", 1)[1].splitlines()[0])
    assert sum(settled.values()) == 8
    assert settled.get("succeeded", 0) >= 1 and settled.get("compensated", 0) >= 1
    assert (tmp_path / "var" / "reliability.sqlite3").exists()
