"""The console looks like the product, in English and in Chinese: its name, indented JSON, a timeline that fits,
a dashboard that refreshes itself. Writes the docs' screenshots (docs/screenshots/)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dlq.alerting.models import AlertKind, AlertRule
from dlq.alerting.rules import alerts_evaluate
from dlq.models import DLQItem
from dlq.roles import roles_setup
from tasks.execution.runner import task_run
from tasks.models import AttemptOutcome, StepAttempt, Task, TaskState
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.browser.conftest import PASSWORD, docs_screenshot, log_in
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

LONG_ERROR = "upstream-said-no:" + "x" * 2000  # no space to break at
LONG_CODE = "E" * 100  # the longest error code a row holds, no space either
LONG_WORKER = "worker-" + "w" * 150
LANGUAGES = {"en": ("en-US", "Reliability Console"), "zh-hans": ("zh-CN", "可靠性控制台")}


@pytest.fixture
def console(clean_redis):
    """A supervisor, dead letters (one with a very long error), an hour of finished tasks and retries, an alert."""
    roles_setup()
    user = get_user_model().objects.create_user("supervisor-b", password=PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get(name="supervisor"))
    parked = []
    for topic in ("q3-revenue", "q4-forecast", "churn"):
        task = task_submit(pipeline="t_parked", input={"fail": True, "topic": topic, "user_id": "u-42"})
        task_run(task_id=str(task.pk), worker="worker-1")
        parked.append(task)
    compensated = task_submit(pipeline="t_local", input={"fail_b": "permanent", "topic": "weekly-digest"})
    task_run(task_id=str(compensated.pk), worker="worker-1")
    with door_forced():
        StepAttempt.objects.filter(task_id=compensated.pk, outcome=AttemptOutcome.PERMANENT_ERROR).update(
            error_message=LONG_ERROR, error_code=LONG_CODE, worker=LONG_WORKER
        )
    with door_forced():
        Task.objects.filter(pk=compensated.pk).update(failure_message=LONG_ERROR, failure_code=LONG_CODE)
    with door_forced():
        DLQItem.objects.filter(task=compensated).update(error_message=LONG_ERROR, error_code=LONG_CODE)
    now = timezone.now()
    # Two hours of work: a few tasks finish every minute, some fail, some retries.
    for minute in range(120):
        outcomes = [TaskState.SUCCEEDED] * (2 + minute * 7 % 5)
        outcomes += [TaskState.FAILED] * (minute % 7 == 0) + [TaskState.COMPENSATED] * (minute % 11 == 0)
        for state in outcomes:
            done = task_submit(pipeline="t_local", input={"minute": minute})
            with door_forced():
                finished_at = now - timedelta(minutes=minute, seconds=5)
                Task.objects.filter(pk=done.pk).update(state=state, finished_at=finished_at)
        for _ in range(minute * 7 % 5 // 2):
            StepAttempt.objects.create(
                task_id=parked[0].pk,
                step_index=2,
                step_name="parked_finish",
                attempt=1,
                started_at=now - timedelta(minutes=minute, seconds=7),
                finished_at=now - timedelta(minutes=minute, seconds=5),
                outcome=AttemptOutcome.TRANSIENT_ERROR,
                error_code="http_503",
                retry_delay_seconds=1.5,
            )
    AlertRule.objects.create(name="open-items", kind=AlertKind.OPEN_ITEMS, threshold=2)
    alerts_evaluate()
    return {
        "item": DLQItem.objects.get(task=parked[0]),
        "long_error_item": DLQItem.objects.get(task=compensated),
        "long_error_task": compensated,
        "user": user,
    }


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_console_looks_like_the_product(browser_factory, live_server, console, language):
    browser_language, name = LANGUAGES[language]
    driver = browser_factory(language=browser_language)
    wait = WebDriverWait(driver, 20)
    log_in(driver, live_server, "supervisor-b")
    suffix = "" if language == "en" else "-zh-hans"

    # The dashboard: the console's name, the per-minute charts, the refresh control.
    driver.get(f"{live_server.url}/admin/dashboard/")
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == language
    assert name in driver.title and name in driver.find_element(By.ID, "site-name").text
    assert "Django" not in driver.find_element(By.ID, "header").text
    for section in ("ops-finished", "ops-retries", "ops-growth"):
        assert driver.find_elements(By.CSS_SELECTOR, f"#{section} svg polyline"), section
    wait.until(lambda d: d.find_element(By.ID, "ops-refresh-toggle").text)  # the script has run
    viewport = driver.execute_script("return document.documentElement.clientWidth")
    assert driver.execute_script("return document.documentElement.scrollWidth") <= viewport
    docs_screenshot(driver, f"dashboard{suffix}")

    # The DLQ item: labels in the reader's language, the input as indented JSON.
    item = console["item"]
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/{item.pk}/change/")
    assert name in driver.title
    snapshot = driver.find_element(By.ID, "input-snapshot").text
    assert '"topic": "q3-revenue"' in snapshot and "\n  " in snapshot and "{'topic'" not in snapshot
    labels = driver.find_element(By.ID, "content-main").text
    if language == "zh-hans":
        assert "失败步骤" in labels, labels
        assert "Failing step" not in labels and "Reason code" not in labels
        assert "步骤 'parked_finish' 因永久性错误失败" in labels
    else:
        assert "Failing step" in labels and "Step 'parked_finish' failed with a permanent error" in labels
    docs_screenshot(driver, f"dlq-item{suffix}")
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/{console['long_error_item'].pk}/change/")
    viewport = driver.execute_script("return document.documentElement.clientWidth")
    assert driver.execute_script("return document.documentElement.scrollWidth") <= viewport

    # The task page: a 2,000-character error without spaces wraps inside the screen.
    task = console["long_error_task"]
    driver.get(f"{live_server.url}/admin/tasks/task/{task.pk}/change/")
    timeline = driver.find_element(By.CSS_SELECTOR, "#rc-timeline table")
    assert "upstream-said-no:xxxx" in timeline.text
    viewport = driver.execute_script("return document.documentElement.clientWidth")
    assert driver.execute_script("return arguments[0].scrollWidth", timeline) <= viewport
    assert driver.execute_script("return document.documentElement.scrollWidth") <= viewport
    docs_screenshot(driver, f"task-page{suffix}")


def open_total(driver) -> int:
    # Read in one script call: a refresh may swap the element between a lookup and a read.
    return int(driver.execute_script("return document.getElementById('ops-open-total').textContent").split()[0])


def test_the_dashboard_refreshes_itself_until_paused(browser_factory, live_server, console):
    driver = browser_factory()
    log_in(driver, live_server, "supervisor-b")
    driver.get(f"{live_server.url}/admin/dashboard/")
    before = open_total(driver)
    driver.execute_script("window.notReloaded = true")

    failed = task_submit(pipeline="t_parked", input={"fail": True})
    task_run(task_id=str(failed.pk), worker="worker-1")

    # Within one refresh (15 s) the new item shows, swapped in place: the page itself was not reloaded.
    wait_for(
        lambda: open_total(driver) == before + 1,
        timeout=25,
        message="the dashboard to refresh its figures",
    )
    assert driver.execute_script("return window.notReloaded") is True
    assert driver.find_element(By.ID, "ops-refresh").get_attribute("data-refreshes") == "1"

    # Paused, it stays paused across a reload (the choice is kept in the browser).
    toggle = driver.find_element(By.ID, "ops-refresh-toggle")
    assert toggle.text == "Pause auto-refresh"
    toggle.click()
    assert toggle.text == "Resume auto-refresh" and toggle.get_attribute("aria-pressed") == "true"
    driver.refresh()
    toggle = WebDriverWait(driver, 10).until(EC.presence_of_element_located((By.ID, "ops-refresh-toggle")))
    WebDriverWait(driver, 10).until(lambda d: toggle.text == "Resume auto-refresh")
    assert "paused" in driver.find_element(By.ID, "ops-refresh-status").text
