"""What a worker says to PostgreSQL and Redis per task, counted on the wire (devtools/wire_counter.py).

A real ``manage.py rqworker`` reaches both servers through counting relays
and drains tasks whose steps do nothing, so what is left is the engine's
own conversation: round trips and transactions, counted as the servers see
them. Counts, not times: the same code gives the same figures on a loaded
machine. The worker runs without RQ's scheduler, whose once-a-second polls
are not a job's.

Floors (the hot path's budget): a 1-step task takes at most 2 PostgreSQL
round trips and 2 transactions, and at most 10 Redis round trips for its
job; each further step 1 round trip and 1 transaction.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from django.conf import settings

from devtools.wire_counter import POSTGRES, REDIS, Counts, WireCounter
from tasks import task_submit
from tasks.models import Task, TaskState
from tests.support import ManagedProcess, manage, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance, pytest.mark.processes]

ONE_STEP_TASKS = 20
TEN_STEP_TASKS = 10
# The budget per task (module docstring).
POSTGRES_ROUND_TRIPS_ONE_STEP = 2
POSTGRES_TRANSACTIONS_ONE_STEP = 2
REDIS_ROUND_TRIPS_PER_JOB = 10
POSTGRES_ROUND_TRIPS_PER_FURTHER_STEP = 1
POSTGRES_TRANSACTIONS_PER_FURTHER_STEP = 1


@pytest.fixture
def relays(redis_server):
    db = settings.DATABASES["default"]
    redis_url = urlparse(settings.REDIS_URL)
    with (
        WireCounter(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432), POSTGRES) as postgres,
        WireCounter(redis_url.hostname, redis_url.port, REDIS) as redis,
    ):
        yield postgres, redis


@pytest.fixture
def quiet_worker(relays, engine_env):
    """One worker of every engine queue, both of its servers reached through the relays."""
    from django.db import connection

    postgres, redis = relays
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    redis_url = urlparse(settings.REDIS_URL)
    env = engine_env(
        DATABASE_URL=(
            f"postgresql://{user}{password}@127.0.0.1:{postgres.port}/{connection.settings_dict['NAME']}"
            "?sslmode=disable&gssencmode=disable"
        ),
        REDIS_URL=f"redis://127.0.0.1:{redis.port}{redis_url.path}",
        # No lease is extended while these tasks run: a heartbeat's writes are not a step's.
        RELIABILITY_LEASE_SECONDS=300,
    )
    worker = ManagedProcess("worker", manage("rqworker"), env)
    yield worker
    worker.stop()


def _drained(tasks: list[Task], redis: WireCounter, worker: ManagedProcess) -> None:
    """Wait until every task succeeded and the worker is back, blocked, waiting for its next job."""

    def done() -> bool:
        assert worker.alive(), worker.output()
        finished = Task.objects.filter(pk__in=[task.pk for task in tasks], state=TaskState.SUCCEEDED).count()
        turns = redis.counts().turns
        return finished == len(tasks) and bool(turns) and "BLPOP" in turns[-1]

    wait_for(done, timeout=60, message=f"{len(tasks)} tasks to succeed and the worker to wait again")


def _drain(pipeline: str, count: int, relays, worker) -> tuple[Counts, Counts]:
    """PostgreSQL's and Redis's counts while the worker ran ``count`` tasks of ``pipeline`` (after a first one)."""
    postgres, redis = relays
    # A first task opens the worker's database connection and loads what it loads once.
    _drained([task_submit(pipeline=pipeline, input={"warm": True})], redis, worker)
    before = postgres.counts(), redis.counts()
    tasks = [task_submit(pipeline=pipeline, input={"n": n}) for n in range(count)]
    _drained(tasks, redis, worker)
    return postgres.counts().since(before[0]), redis.counts().since(before[1])


def _conversation(postgres: Counts, redis: Counts, count: int) -> str:
    one_job = len(redis.turns) // count
    return (
        f"PostgreSQL, {postgres.round_trips} round trips and {postgres.transactions} transactions for {count} tasks; "
        f"one task's statements:\n  "
        + "\n  ".join(statement[:160] for statement in postgres.statements[: len(postgres.statements) // count])
        + f"\nRedis, {redis.round_trips} round trips; one job's:\n  "
        + "\n  ".join(" ".join(turn) for turn in redis.turns[:one_job])
    )


def test_a_task_costs_its_budget_of_round_trips(relays, quiet_worker):
    postgres_one, redis_one = _drain("t_quiet_1", ONE_STEP_TASKS, relays, quiet_worker)
    postgres_ten, redis_ten = _drain("t_quiet_10", TEN_STEP_TASKS, relays, quiet_worker)
    said = _conversation(postgres_one, redis_one, ONE_STEP_TASKS)
    print(said)  # the figures behind the floors, for the performance docs

    per_task = postgres_one.round_trips / ONE_STEP_TASKS
    assert per_task <= POSTGRES_ROUND_TRIPS_ONE_STEP, said
    assert postgres_one.transactions / ONE_STEP_TASKS <= POSTGRES_TRANSACTIONS_ONE_STEP, said
    assert redis_one.round_trips / ONE_STEP_TASKS <= REDIS_ROUND_TRIPS_PER_JOB, said

    further = (postgres_ten.round_trips / TEN_STEP_TASKS - per_task) / 9
    said_ten = _conversation(postgres_ten, redis_ten, TEN_STEP_TASKS)
    assert further <= POSTGRES_ROUND_TRIPS_PER_FURTHER_STEP, said_ten
    further_transactions = (postgres_ten.transactions / TEN_STEP_TASKS - postgres_one.transactions / ONE_STEP_TASKS) / 9
    assert further_transactions <= POSTGRES_TRANSACTIONS_PER_FURTHER_STEP, said_ten
    # A job of a longer task costs Redis no more than a 1-step one: no round trip happens between two steps.
    assert redis_ten.round_trips / TEN_STEP_TASKS <= REDIS_ROUND_TRIPS_PER_JOB, said_ten
