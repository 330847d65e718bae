"""A fuzz pass over every admin list's query string: random lookups, NUL bytes, surrogates, huge values.

Each list of the console is requested with seeded random query strings, as a
superuser (who sees every list). Any answer is fine but a server error: a
filter the list cannot apply is the admin's own "invalid filter" redirect or a
400. The seed is fixed so a failure is reproducible; the cases are printed.
"""

from __future__ import annotations

import random
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from dlq.live_actions import PIPELINE_ACTIONS
from tasks.execution.runner import task_run
from tasks.models import Task
from tasks.submission.submit import task_submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = 20261201
CASES_PER_LIST = 80
LOOKUPS = [
    "",
    "__exact",
    "__in",
    "__gt",
    "__lte",
    "__isnull",
    "__regex",
    "__iregex",
    "__year",
    "__date",
    "__contains",
    "__icontains",
    "__startswith",
    "__range",
    "__bogus",
    "__id",
    "__pk__gt",
    "__task__pipeline",
]
SPECIAL_KEYS = [
    "q",
    "o",
    "p",
    "all",
    "e",
    "_to_field",
    "_popup",
    "_changelist_filters",
    "bogus",
    "status",
    "pipeline",
    "fingerprint",
    "reason_code",
    "age",
    "state",
    "created_at__gte",
    "action",
]
# Raw (already percent-encoded) values: NUL, lone surrogate and invalid UTF-8 bytes, huge, odd.
VALUES = [
    "",
    "1",
    "-1",
    "0",
    "99999999999999999999999999",
    "1e309",
    "a%00b",
    "%00",
    "%ED%A0%80",
    "%ED%BF%BF",
    "%FF%FE",
    "%C0%80",
    "x" * 100_000,
    "%27%3B%20DROP%20TABLE%20tasks_task%3B--",
    "1%2C2%2Cx",
    "true",
    "null",
    "2026-13-45",
    "%28",
    "%5B",
    "*",
    "%E6%B5%8B%E8%AF%95",
    "..%2F..%2Fetc%2Fpasswd",
    "%0D%0ASet-Cookie:x",
    "-",
    "0.0.0",
    "%25",
    "%2B",
    "2026-12-01T00:00:00Z",
]


def admin_lists() -> list[str]:
    urls = []
    for model in admin.site._registry:
        opts = model._meta
        urls.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    urls += [
        reverse("dashboard"),
        "/admin/dlq/dlqitem/bulk/close/",
        "/admin/dlq/dlqitem/bulk/retry/",
        "/admin/dlq/dlqitem/selected/close/",
        "/admin/queues/",
        *live_control_pages(),
    ]
    return sorted(urls)


def live_control_pages() -> list[str]:
    """The Pipelines page, each of its confirmation pages, and a queued task's cancel confirmation."""
    queued = Task.objects.filter(state="queued").order_by("created_at").first()
    return [
        reverse("pipelines"),
        *(reverse("pipeline_act", args=["t_local", action]) for action in PIPELINE_ACTIONS),
        *([reverse("admin:tasks_task_cancel", args=[queued.pk])] if queued else []),
    ]


def field_keys(path: str) -> list[str]:
    for model in admin.site._registry:
        opts = model._meta
        if path == reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"):
            return [field.name for field in opts.get_fields()]
    return []


def query_strings(path: str, rng: random.Random) -> list[str]:
    keys = field_keys(path) + SPECIAL_KEYS
    cases = []
    for _ in range(CASES_PER_LIST):
        params = []
        for _ in range(rng.randint(1, 3)):
            key = quote(rng.choice(keys) + rng.choice(LOOKUPS), safe="_")
            if rng.random() < 0.1:
                key = rng.choice(["%00", "a%00", "%ED%A0%80", "x" * 5000])
            params.append(f"{key}={rng.choice(VALUES)}")
        cases.append("&".join(params))
    return cases


@pytest.fixture
def superuser_client(client, clean_redis):
    # Rows in the lists, so filters and the pages' own queries meet real data.
    for n in range(3):
        task = task_submit(pipeline="t_local", input={"fail_b": "permanent", "n": n})
        task_run(task_id=str(task.pk), worker="w1")
    assert Task.objects.filter(in_dlq=True).count() == 3
    task_submit(pipeline="t_local", input={})  # queued: its cancel confirmation is a page to fuzz
    user = get_user_model().objects.create_superuser("fuzz-root", password="pw-for-tests-only")
    client.force_login(user)
    client.raise_request_exception = False  # a 500 is an answer to count, not an exception in the test
    return client


def test_no_admin_list_answers_a_fuzzed_query_string_with_a_server_error(superuser_client):
    rng = random.Random(SEED)
    lists = admin_lists()
    assert len(lists) >= 12, lists  # every registered model's list, plus the console's own pages
    failures, statuses = [], {}
    for path in lists:
        for query in query_strings(path, rng):
            response = superuser_client.get(f"{path}?{query}")
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500:
                failures.append(f"{response.status_code} {path}?{query[:200]}")
    print(f"fuzzed {sum(statuses.values())} requests over {len(lists)} lists: statuses {sorted(statuses.items())}")
    assert not failures, "\n".join(failures[:40])
    assert sum(statuses.values()) == len(lists) * CASES_PER_LIST


# The forms of live control, posted with random fields: any answer (a form error, a refusal, a redirect) but a 5xx.
FORM_FIELDS = ["reason", "max_concurrency", "rate_limit", "no_concurrency_limit", "no_rate_limit", "bogus"]


def test_no_live_control_form_answers_fuzzed_fields_with_a_server_error(superuser_client):
    rng = random.Random(SEED + 1)
    forms = [url for url in live_control_pages() if "/act/" in url]
    assert len(forms) == len(PIPELINE_ACTIONS) + 1
    failures, statuses = [], {}
    for url in forms:
        for _ in range(CASES_PER_LIST // 2):
            fields = rng.sample(FORM_FIELDS, rng.randint(0, len(FORM_FIELDS)))
            body = "&".join(f"{field}={rng.choice(VALUES)}" for field in fields)
            query = rng.choice(["", "", f"?{rng.choice(SPECIAL_KEYS)}={rng.choice(VALUES)}"])
            response = superuser_client.generic(
                "POST", url + query, body, content_type="application/x-www-form-urlencoded"
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500:
                failures.append(f"{response.status_code} POST {url}{query[:100]} {body[:200]}")
    print(f"fuzzed {sum(statuses.values())} form posts: statuses {sorted(statuses.items())}")
    assert not failures, "\n".join(failures[:40])
