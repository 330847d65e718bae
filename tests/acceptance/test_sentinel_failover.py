"""Redis under Sentinel: the primary is SIGKILLed mid-run, Sentinel promotes its replica, and every task still
finishes exactly once.

Real parts throughout: a primary, a replica and three Sentinels (``chaos.topology.SentinelRedis``), four workers
and the sweeper configured through ``REDIS_SENTINELS``, the test process enqueueing through the same Sentinels, and
the report-platform simulator counting every effect. Replication is asynchronous, so the promoted replica may lack
the latest deliveries: the database is the source of truth and the sweeper delivers again.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict

import django_rq
import pytest
from rq import Worker

from chaos.topology import SentinelRedis
from reliability_console.config import redis_connection_config
from tasks.delivery.enqueue import get_queue, job_id
from tasks.models import Task
from tasks.submission.submit import task_submit
from tests.support import LOG_DIR, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}
EFFECT_KINDS = ("charge", "report", "file_put", "notification")
TASKS_BEFORE, TASKS_AFTER = 36, 12
# Each report takes this long at the platform, so tasks are mid-step when the primary dies.
REPORT_SECONDS = 0.4


@pytest.fixture
def sentinel_redis(settings):
    """A Sentinel-managed Redis; the test process's own django-rq clients go through it too."""
    redis = SentinelRedis(LOG_DIR / f"sentinel-{os.getpid()}-{time.monotonic_ns()}")
    redis.start()
    env = redis.env()
    queues = {}
    for name, queue in settings.RQ_QUEUES.items():
        kept = {key: value for key, value in queue.items() if key != "URL"}
        sentinel = redis_connection_config(
            env["REDIS_URL"], sentinels=env["REDIS_SENTINELS"].split(","), master=env["REDIS_SENTINEL_MASTER"]
        )
        queues[name] = {**kept, **sentinel}
    # django-rq reads RQ_QUEUES on every get_queue() and keeps no connection: the override reaches every enqueue.
    settings.RQ_QUEUES = queues
    yield redis
    redis.stop()


def submit(count: int, offset: int) -> list[Task]:
    return [
        task_submit(pipeline="report", input={"user_id": f"user-{n % 7}", "topic": f"failover {n}"})
        for n in range(offset, offset + count)
    ]


def unfinished(ids) -> str:
    """What the database and Redis say of each task that did not finish: the first thing to read on a failure."""
    queue = get_queue()
    lines = []
    for task in Task.objects.filter(pk__in=ids).exclude(state__in=TERMINAL):
        job = queue.job_class.key_for(job_id(task.pk, task.fencing_token))
        lines.append(
            f"{task.pk} state={task.state} token={task.fencing_token} step={task.current_step} "
            f"attempt={task.step_attempt} lease={task.lease_owner!r} until={task.lease_expires_at} "
            f"updated={task.updated_at} retry_at={task.retry_at} hold={task.hold} "
            f"job={queue.connection.hget(job, 'status')!r}"
        )
    return "\n".join(lines)


def test_tasks_finish_exactly_once_when_sentinel_promotes_a_replica_mid_run(
    platform, sentinel_redis, start_workers, start_sweeper
):
    platform.set_faults(rules=[{"path_prefix": "/v1/reports", "slow": REPORT_SECONDS, "times": 10_000}])
    env = sentinel_redis.env()
    # A worker whose Redis vanishes under it may exit (RQ quits on an error it did not expect); a supervisor
    # starts another, as in production.
    pool = start_workers(4, replace_dead=True, **env)
    sweeper = start_sweeper(**env)
    tasks = submit(TASKS_BEFORE, 0)
    ids = [task.pk for task in tasks]

    def mid_run():
        states = Counter(Task.objects.filter(pk__in=ids).values_list("state", flat=True))
        return states if states["succeeded"] >= 4 and states["running"] >= 1 else None

    wait_for(mid_run, timeout=60, message="some tasks done and some running")
    old, new = sentinel_redis.failover()
    assert new != old
    assert sentinel_redis.primary_port() == new
    tasks += submit(TASKS_AFTER, TASKS_BEFORE)  # enqueued through the promoted primary
    ids = [task.pk for task in tasks]

    def all_terminal():
        return Task.objects.filter(pk__in=ids).exclude(state__in=TERMINAL).count() == 0

    try:
        wait_for(all_terminal, timeout=180, message="every task to finish after the failover")
    except AssertionError:
        print(pool.logs())
        print(f"--- sweeper\n{sweeper.tail(6000)}")
        print("--- unfinished tasks\n" + unfinished(ids))
        raise
    finished = Task.objects.filter(pk__in=ids)
    assert Counter(task.state for task in finished) == Counter({"succeeded": len(ids)}), pool.logs()

    calls = defaultdict(list)
    for call in platform.calls():
        calls[call["task_id"]].append(call)
    for task in finished:
        task_calls = calls[str(task.pk)]
        effects = Counter(call["kind"] for call in task_calls if call["effect"])
        assert effects == Counter({kind: 1 for kind in EFFECT_KINDS}), (task.pk, effects)
        # One key per effect, the same on every call of it (a re-delivery after the failover sends it again).
        keys = defaultdict(set)
        for call in task_calls:
            keys[call["kind"]].add(call["idempotency_key"])
        assert all(len(sent) == 1 for sent in keys.values()), (task.pk, keys)
        assert all(key.startswith(f"rc-{task.pk}-g0-") for (key,) in keys.values()), keys
    state = platform.state()
    charges = Counter(charge["task_id"] for charge in state["charges"].values() if not charge["refunded"])
    assert charges == Counter({str(pk): 1 for pk in ids})
    assert Counter(report["task_id"] for report in state["reports"]) == Counter({str(pk): 1 for pk in ids})
    assert Counter(note["task_id"] for note in state["notifications"]) == Counter({str(pk): 1 for pk in ids})
    assert sorted(file["task_id"] for file in state["files"].values()) == sorted(str(pk) for pk in ids)


def test_an_idle_worker_under_sentinel_stops_promptly_on_sigterm(sentinel_redis, start_workers):
    # Before the connection class of reliability_console.sentinel, an idle worker's interrupted BLPOP left its
    # reply on the connection and the worker hung in its own shutdown until that wait timed out (minutes).
    pool = start_workers(1, **sentinel_redis.env())
    (worker,) = pool.workers
    wait_for(lambda: "Listening on" in worker.tail(4000), timeout=60, message="the worker to listen")
    connection = django_rq.get_connection("default")  # through the Sentinels (the fixture's settings)

    def idle_in_blpop():
        workers = Worker.all(connection=connection)
        # RQ marks the worker idle just before it blocks in BLPOP, after its registry cleaning.
        return (
            workers and all(w.get_state() == "idle" for w in workers) and "cleaning group registries" in worker.tail()
        )

    wait_for(idle_in_blpop, timeout=30, message="the worker to wait idle for a job")
    worker.terminate()  # SIGTERM: a warm shutdown
    try:
        wait_for(lambda: not worker.alive(), timeout=10, message="the idle worker to exit after SIGTERM")
    except AssertionError:
        print(worker.tail(8000))
        raise
    assert "warm shut down requested" in worker.tail(4000)
