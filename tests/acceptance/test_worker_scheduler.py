"""RQ's scheduler process leaves with its worker, even one killed with SIGKILL.

RQ forks the scheduler from the worker; killed hard (OOM killer, ``kill -9``)
the worker left it behind as an orphan that kept heartbeating and holding the
scheduler lock, running the code of whatever release forked it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tasks.delivery.enqueue import redis_client
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

LOCK = "rq:scheduler-lock:default"


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()  # state, ppid, ...


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[1] == str(pid):
                found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # an unreaped zombie has stopped


def test_a_worker_killed_with_sigkill_takes_its_scheduler_along(start_workers, clean_redis):
    pool = start_workers(1)
    (worker,) = pool.workers
    scheduler = wait_for(lambda: children(worker.pid), timeout=30, message="the worker to fork its scheduler")[0]
    wait_for(lambda: redis_client().exists(LOCK), timeout=30, message="the scheduler to take its lock")

    worker.kill(signal.SIGKILL)

    wait_for(lambda: not running(scheduler), timeout=20, message="the orphaned scheduler to stop")
    # It stopped cleanly: the lock is released for the next worker's scheduler, not left to expire.
    assert not redis_client().exists(LOCK)
