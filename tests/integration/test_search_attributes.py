"""Search attributes (issue 24, point 4) on real PostgreSQL: declared by a pipeline, read from the input at
submission, set by a step with its checkpoint, found by the API (only the caller's tasks) and the console's
task and DLQ lists (composing with their filters), through the GIN index."""

from __future__ import annotations

import html
import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks import FailurePolicy, Pipeline, registry
from tasks.exceptions import ConfigurationError, InvalidTaskInput, PermanentError
from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create
from tasks.models import ApiClient, DeadLetter, StepAttempt, Task, TaskState
from tasks.pipelines.retry import RetryPolicy
from tasks.selectors import attribute_condition
from tasks.submission.submit import task_submit
from tests.support import plan_uses_index

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS = "t_attr_orders"
INDEX = "task_attributes_gin_idx"


@pytest.fixture(autouse=True)
def _pipelines(clean_redis):
    orders = Pipeline(
        ORDERS,
        search_attributes=("order_id", "customer_id", "invoice"),
        failure_policy=FailurePolicy.PARK,
        retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01, jitter=False),
    )

    @orders.step
    def charge(ctx):
        if ctx.input.get("invoice_on_attempt") == ctx.attempt or ctx.input.get("invoice_then_fail"):
            ctx.set_attributes(invoice=f"INV-{ctx.attempt}", customer_id=None)
        if ctx.input.get("invoice_then_fail") and ctx.attempt == 1:
            raise PermanentError("refused after setting the invoice", code="refused")
        if ctx.input.get("undeclared"):
            ctx.set_attributes(coupon="X")
        if ctx.input.get("fail"):
            raise PermanentError("card declined", code="card_declined")
        if ctx.input.get("retry_once") and ctx.attempt == 1:
            from tasks.exceptions import TransientError

            raise TransientError("again", code="again")
        return {"charged": True}

    @orders.step
    def ship(ctx):
        return {"shipped": True}

    yield
    registry.unregister(ORDERS)


@pytest.fixture
def clients():
    made = []
    for name in ("attr-client-a", "attr-client-b"):
        token = api_client_create(name=name)[1]
        made.append((ApiClient.objects.get(name=name), token))
    return made


def ran(task: Task) -> Task:
    """Run the task until it ends (a retry runs once its time has come; polled, at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        task_run(task_id=str(task.pk), worker="w1")
        task = Task.objects.get(pk=task.pk)
        if task.state != TaskState.RETRY_SCHEDULED or time.monotonic() > deadline:
            return task
        time.sleep(max(0.0, min(0.05, (task.retry_at - timezone.now()).total_seconds())))


# --- declaration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (("Order",), "must match"),
        (("order-id",), "must match"),
        (("a" * 64,), "must match"),
        (("order_id", "order_id"), "named twice"),
        (tuple(f"k{i}" for i in range(11)), "at most 10"),
        ("order_id", "not one string"),
    ],
)
def test_attribute_names_are_checked_when_the_pipeline_is_declared(names, says):
    with pytest.raises(ConfigurationError, match=says):
        Pipeline("t_attr_bad", search_attributes=names, register=False)


# --- submission --------------------------------------------------------------------------------------------


def test_the_input_gives_the_attributes_numbers_as_text_and_a_missing_one_is_absent():
    task = task_submit(pipeline=ORDERS, input={"order_id": "A1001", "customer_id": 42, "note": "x"})
    assert Task.objects.get(pk=task.pk).attributes == {"order_id": "A1001", "customer_id": "42"}
    bare = task_submit(pipeline=ORDERS, input={"note": "none", "order_id": None})
    assert Task.objects.get(pk=bare.pk).attributes is None


@pytest.mark.parametrize(
    ("value", "code_word"),
    [
        (True, "string or a number"),
        (["A1"], "string or a number"),
        ("x" * 201, "1 to 200"),
        ({"id": 1}, "string or a number"),
    ],
)
def test_a_bad_attribute_value_refuses_the_submission_and_stores_nothing(value, code_word):
    before = Task.objects.count()
    with pytest.raises(InvalidTaskInput, match=code_word) as refused:
        task_submit(pipeline=ORDERS, input={"order_id": value})
    assert refused.value.details == {"attribute": "order_id"}
    assert Task.objects.count() == before


def test_an_attribute_the_redaction_rules_call_a_secret_is_refused():
    secret = Pipeline("t_attr_secret", search_attributes=("api_key",), register=True)
    secret.step(lambda ctx: None, name="work")
    try:
        with pytest.raises(InvalidTaskInput, match="would hold a secret"):
            task_submit(pipeline="t_attr_secret", input={"api_key": "k_1234567890abcdef"})
        assert not Task.objects.filter(pipeline="t_attr_secret").exists()
    finally:
        registry.unregister("t_attr_secret")


# --- a step sets them with its checkpoint ------------------------------------------------------------------


def test_a_step_sets_and_removes_attributes_with_its_checkpoint_in_the_same_statements():
    # Both shapes of the step's statement prepared first: what is counted below is what a step sends.
    ran(task_submit(pipeline=ORDERS, input={"order_id": "A0"}))
    ran(task_submit(pipeline=ORDERS, input={"order_id": "A0", "invoice_on_attempt": 1}))
    plain = task_submit(pipeline=ORDERS, input={"order_id": "A1", "customer_id": "C1"})
    setting = task_submit(pipeline=ORDERS, input={"order_id": "A2", "customer_id": "C1", "invoice_on_attempt": 1})
    with CaptureQueriesContext(connection) as plain_queries:
        assert ran(plain).state == TaskState.SUCCEEDED
    with CaptureQueriesContext(connection) as setting_queries:
        assert ran(setting).state == TaskState.SUCCEEDED
    # Setting attributes changes the step's one statement, not the number of statements.
    assert len(setting_queries) == len(plain_queries)
    assert Task.objects.get(pk=setting.pk).attributes == {"order_id": "A2", "invoice": "INV-1"}
    assert Task.objects.get(pk=plain.pk).attributes == {"order_id": "A1", "customer_id": "C1"}


def test_attributes_set_by_a_failed_attempt_are_not_kept():
    task = ran(task_submit(pipeline=ORDERS, input={"order_id": "A3", "customer_id": "C3", "invoice_then_fail": True}))
    assert task.state == TaskState.FAILED
    assert task.attributes == {"order_id": "A3", "customer_id": "C3"}  # the failed attempt's change is gone


def test_after_a_retry_the_succeeding_attempts_attributes_are_kept():
    task = ran(task_submit(pipeline=ORDERS, input={"order_id": "A4", "retry_once": True, "invoice_on_attempt": 2}))
    assert task.state == TaskState.SUCCEEDED
    assert task.attributes == {"order_id": "A4", "invoice": "INV-2"}


def test_setting_an_undeclared_attribute_fails_the_step_with_its_code():
    task = ran(task_submit(pipeline=ORDERS, input={"order_id": "A5", "undeclared": True}))
    assert task.state == TaskState.FAILED
    attempt = StepAttempt.objects.get(task=task)
    assert attempt.error_code == "unknown_attribute" and "coupon" in attempt.error_message
    assert task.attributes == {"order_id": "A5"}


# --- the API ----------------------------------------------------------------------------------------------------


def test_the_api_finds_a_task_by_attribute_among_the_callers_tasks_only(clients):
    (mine, token), (theirs, _) = clients
    found = task_submit(pipeline=ORDERS, input={"order_id": "A1001", "customer_id": "C7"}, client=mine)
    task_submit(pipeline=ORDERS, input={"order_id": "A1002", "customer_id": "C7"}, client=mine)
    task_submit(pipeline=ORDERS, input={"order_id": "A1001", "customer_id": "C7"}, client=theirs)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    body = api.get("/api/v1/tasks?attribute.order_id=A1001").json()
    assert [item["id"] for item in body["items"]] == [str(found.pk)]
    assert body["items"][0]["attributes"] == {"order_id": "A1001", "customer_id": "C7"}
    both = api.get("/api/v1/tasks?attribute.customer_id=C7&attribute.order_id=A1001").json()
    assert [item["id"] for item in both["items"]] == [str(found.pk)]
    assert len(api.get("/api/v1/tasks?attribute.customer_id=C7").json()["items"]) == 2
    assert api.get("/api/v1/tasks?attribute.customer_id=C7&state=failed").json()["items"] == []
    assert api.get(f"/api/v1/tasks/{found.pk}").json()["attributes"] == {"order_id": "A1001", "customer_id": "C7"}


@pytest.mark.parametrize(
    "query",
    [
        "attribute.Order=A1",
        "attribute.=A1",
        "attribute.order_id=",
        f"attribute.order_id={'x' * 201}",
        "attribute.order_id=1&attribute.order_id=2",
    ],
)
def test_a_bad_attribute_filter_is_a_400_naming_it(clients, query):
    (_, token), _ = clients
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/v1/tasks?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_filter" and error["details"]["parameter"] == query.split("=")[0]


def test_the_list_query_uses_the_attributes_index():
    query = Task.objects.filter(attribute_condition("order_id", "A1001")).order_by("-created_at")[:20]
    assert INDEX in plan_uses_index(query, INDEX)


# --- the console ------------------------------------------------------------------------------------------------


@pytest.fixture
def staff():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_the_task_list_finds_a_task_by_attribute_and_composes_with_its_filters(staff):
    wanted = ran(task_submit(pipeline=ORDERS, input={"order_id": "B2001", "fail": True}))
    other = ran(task_submit(pipeline=ORDERS, input={"order_id": "B2002"}))
    found = page(staff, "/admin/tasks/task/?q=order_id:B2001")
    assert str(wanted.pk)[:8] in found and str(other.pk)[:8] not in found
    assert str(wanted.pk)[:8] not in page(staff, "/admin/tasks/task/?q=order_id:B2001&state=succeeded")
    assert str(wanted.pk)[:8] in page(staff, f"/admin/tasks/task/?q=order_id:B2001&state={TaskState.FAILED}")
    # The task page shows them, each a link to the list searched by it.
    task_page = page(staff, f"/admin/tasks/task/{wanted.pk}/change/")
    assert "order_id:B2001" in task_page and "?q=order_id%3AB2001" in task_page
    # A value longer than an attribute holds: told, nothing found, no error.
    long = page(staff, f"/admin/tasks/task/?q=order_id:{'x' * 201}")
    assert "at most 200 characters" in long and str(wanted.pk)[:8] not in long


def test_the_dlq_list_and_its_failure_groups_find_an_item_by_customer(staff):
    mine = ran(task_submit(pipeline=ORDERS, input={"order_id": "C1", "customer_id": "CUST-9", "fail": True}))
    ran(task_submit(pipeline=ORDERS, input={"order_id": "C2", "customer_id": "CUST-8", "fail": True}))
    item, other = DeadLetter.objects.get(task=mine), DeadLetter.objects.exclude(task=mine).get()

    def groups(text: str) -> list[str]:
        """Each failure group's row as its cells' text."""
        rows = re.findall(r'<tr class="failure-group">(.*?)</tr>', text, re.S)
        return [" ".join(re.sub(r"<[^>]+>", " ", row).split()) for row in rows]

    everything = page(staff, "/admin/dlq/dlqitem/")
    assert [row.split()[:4] for row in groups(everything)] == [[ORDERS, "charge", "card_declined", "2"]]
    listed = page(staff, "/admin/dlq/dlqitem/?q=customer_id:CUST-9")
    assert f"/admin/dlq/dlqitem/{item.pk}/change/" in listed
    assert f"/admin/dlq/dlqitem/{other.pk}/change/" not in listed
    # The failure groups count the searched items only.
    assert [row.split()[:4] for row in groups(listed)] == [[ORDERS, "charge", "card_declined", "1"]]
    # Composes with the list's filters: the open items of another pipeline have none.
    assert f"/admin/dlq/dlqitem/{item.pk}/change/" not in page(
        staff, "/admin/dlq/dlqitem/?q=customer_id:CUST-9&pipeline=elsewhere"
    )
