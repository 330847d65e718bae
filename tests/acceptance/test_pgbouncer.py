"""The engine behind a real PgBouncer in transaction mode: workers, the sweeper and the API, with platform faults.

A transaction pooler hands every transaction whichever server session is
free, so nothing may rely on session state (a prepared statement, a SET, a
server-side cursor). The deployment that declares the pooler
(``DATABASE_POOLER=transaction``) and the one that forgot to both keep every
promise: each task ends as expected, one effect of each kind per succeeded
task, one idempotency key per effect on every attempt.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter, defaultdict

import pytest

from chaos.topology import PgBouncer
from tasks.lifecycle.clients import api_client_create
from tasks.models import StepAttempt, Task
from tests.support import LOG_DIR, database_url, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}
EFFECT_KINDS = ("charge", "report", "file_put", "notification")
# Errors the engine's own writes raised through a pooler before: none may be recorded as a step's failure.
POOLER_ERRORS = ("prepared statement", "ProgrammingError", "InterfaceError", "OperationalError")


@pytest.fixture
def pgbouncer():
    bouncer = PgBouncer(LOG_DIR, database_url(), pool_mode="transaction", pool_size=4)
    bouncer.start()
    yield bouncer
    bouncer.stop()


def submit(api_url: str, token: str, body: dict) -> str:
    request = urllib.request.Request(
        api_url + "/api/v1/tasks",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201, 202)
        return json.loads(response.read())["id"]


@pytest.mark.parametrize("pooler", ["transaction", "undeclared"])
def test_the_report_pipeline_keeps_every_promise_through_pgbouncer(
    pooler, pgbouncer, platform, start_workers, start_sweeper, start_api_server
):
    platform.set_faults(fail_rate=0.15, throttle_rate=0.1, retry_after=0.2, insufficient_users=["broke-1", "broke-2"])
    through = {"DATABASE_URL": pgbouncer.url(database_url())}
    if pooler == "transaction":
        through["DATABASE_POOLER"] = "transaction"
    server = start_api_server(**through)
    pool = start_workers(3, **through)
    start_sweeper(**through)
    _, token = api_client_create(name=f"pgbouncer-{pooler}")

    users = [f"user-{n}" for n in range(28)] + ["broke-1", "broke-2"]
    ids = [submit(server.url, token, {"pipeline": "report", "input": {"user_id": u, "topic": "pool"}}) for u in users]

    def all_finished():
        return Task.objects.filter(pk__in=ids, state__in=TERMINAL).count() == len(ids)

    try:
        wait_for(all_finished, timeout=180, interval=0.5, message="every task to finish")
    except AssertionError:
        print(pool.logs())
        raise
    states = {str(k): v for k, v in Task.objects.filter(pk__in=ids).values_list("pk", "state")}
    # A 25 % fault rate gives every step a 0.25**5 chance to exhaust its 5 attempts (about one run in five
    # sees one such task among these 60): that task is rightly compensated, but only for that reason.
    exhausted = set()
    for task_id, user in zip(ids, users, strict=True):
        if user.startswith("broke") or states[task_id] == "succeeded":
            continue
        exhausted.add(task_id)
        task = Task.objects.get(pk=task_id)
        assert (task.state, task.failure_reason) == ("compensated", "attempts_exhausted"), (task_id, task.state)
        codes = set(
            StepAttempt.objects.filter(task_id=task_id, kind="step", step_name=task.failed_step).values_list(
                "error_code", flat=True
            )
        )
        assert codes <= {"http_503", "rate_limited"}, (task_id, codes)
    assert len(exhausted) <= 2, exhausted
    expected = {
        task_id: "compensated" if user.startswith("broke") or task_id in exhausted else "succeeded"
        for task_id, user in zip(ids, users, strict=True)
    }
    assert states == expected

    bookkeeping = StepAttempt.objects.filter(task_id__in=ids).exclude(error_message="")
    for fragment in POOLER_ERRORS:
        leaked = list(bookkeeping.filter(error_message__icontains=fragment).values_list("error_code", "error_message"))
        assert not leaked, leaked

    for task_id, user in zip(ids, users, strict=True):
        calls = platform.calls(task_id=task_id)
        done = Counter(call["kind"] for call in calls if call["effect"])
        keys = defaultdict(set)
        for call in calls:
            if call["idempotency_key"]:
                keys[call["kind"]].add(call["idempotency_key"])
        assert all(len(per_kind) == 1 for per_kind in keys.values()), (task_id, dict(keys))
        if user.startswith("broke"):
            assert not done["charge"], (task_id, done)
        elif task_id in exhausted:
            assert done["charge"] == done["refund"], (task_id, done)
        else:
            assert done == Counter({kind: 1 for kind in EFFECT_KINDS}), (task_id, done)


def test_the_api_answers_503_while_the_database_is_unreachable_and_recovers_by_itself(
    pgbouncer, platform, start_api_server
):
    server = start_api_server(DATABASE_URL=pgbouncer.url(database_url()), DATABASE_POOLER="transaction")
    _, token = api_client_create(name="outage")
    body = {"pipeline": "report", "input": {"user_id": "u", "topic": "outage"}}
    assert submit(server.url, token, body)

    pgbouncer.stop()  # every connection of the web process is cut; no new one can be made
    request = urllib.request.Request(
        server.url + "/api/v1/tasks",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Idempotency-Key": "k-1"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 503
    assert refused.value.headers["Retry-After"] == "1"
    assert json.loads(refused.value.read())["error"]["code"] == "database_unavailable"

    pgbouncer.start()
    with urllib.request.urlopen(request, timeout=30) as response:  # the same request again, on fresh connections
        created = json.loads(response.read())
    assert Task.objects.filter(pk=created["id"]).exists()
