"""The engine runs without the console: migrated alone, a failing task is compensated and dead-lettered.

Settings without ``dlq`` (``tests.engine_only.settings``), a database of its
own, a real worker process and the sweeper: the layering promise of
ARCHITECTURE.md ("tasks/ runs alone") checked end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT, ManagedProcess, WorkerPool, manage, process_env, throwaway_database, wait_for

pytestmark = pytest.mark.acceptance

SNIPPET = """
import json, sys
import django
django.setup()
from tasks.submission.submit import task_submit
from tasks.models import DeadLetter, Task
if sys.argv[1] == "submit":
    print(task_submit(pipeline="t_local", input={"fail_b": "permanent"}).pk)
else:
    task = Task.objects.get(pk=sys.argv[2])
    items = list(DeadLetter.objects.filter(task=task).values_list("status", "reason_code", "error_code"))
    print(json.dumps({"state": task.state, "in_dlq": task.in_dlq, "items": items}))
"""


@pytest.fixture
def engine_only_env(clean_redis):
    with throwaway_database("rc_engine_only") as db:
        yield process_env(
            DATABASE_URL=f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            DJANGO_SETTINGS_MODULE="tests.engine_only.settings",
            RELIABILITY_PIPELINE_MODULES="tests.pipelines",
            RELIABILITY_LEASE_SECONDS=3,
            RELIABILITY_SWEEP_INTERVAL_SECONDS=0.5,
        )


def run(env, *argv: str) -> str:
    result = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_deployment_without_the_console_fails_compensates_and_dead_letters_a_task(engine_only_env):
    env = engine_only_env
    run(env, *manage("migrate", "--noinput"))
    list_tables = "from django.db import connection as c; print(c.introspection.table_names())"
    tables = run(env, *manage("shell", "-c", list_tables))
    assert "dlq_dlqitem" in tables and "dlq_auditentry" not in tables  # the engine's record, none of the console's

    task_id = run(env, sys.executable, "-c", SNIPPET, "submit").strip()
    pool = WorkerPool(1, env)
    sweeper = ManagedProcess("sweeper", manage("run_sweeper"), env)
    try:

        def settled():
            found = json.loads(run(env, sys.executable, "-c", SNIPPET, "check", task_id))
            return found if found["state"] == "compensated" else None

        found = wait_for(settled, timeout=60, interval=0.5, message="the task to be compensated")
    finally:
        sweeper.stop()
        pool.stop()
    assert found["in_dlq"] is True
    assert found["items"] == [["compensated", "permanent_error", "refused"]]
