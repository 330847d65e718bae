"""An operator and a viewer use the console in a real browser against a live server."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dlq.models import AuditEntry, DLQItem
from dlq.roles import roles_setup
from tasks.execution.runner import task_run
from tasks.models import DLQStatus, Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.browser.conftest import PASSWORD, docs_screenshot, log_in, screenshot
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]


@pytest.fixture
def people(clean_redis):
    roles_setup()
    made = {}
    for role in ("viewer", "operator"):
        user = get_user_model().objects.create_user(f"{role}-b", password=PASSWORD, is_staff=True)
        user.groups.add(Group.objects.get(name=role))
        made[role] = user
    return made


def failed_items(count: int, pipeline: str = "t_parked", **input_) -> list[DLQItem]:
    items = []
    for _ in range(count):
        task = task_submit(pipeline=pipeline, input={"fail": True, **input_})
        task_run(task_id=str(task.pk), worker="seed")
        items.append(DLQItem.objects.get(task=task))
    return items


def test_an_operator_triages_a_failure_group_and_retries_an_item(
    browser_factory, live_server, people, start_workers, settings
):
    settings.REPORT_PLATFORM_URL = "http://127.0.0.1:9"  # not used by t_parked
    items = failed_items(3)
    failed_items(1, pipeline="t_local", fail_b="permanent")
    target = items[0]
    start_workers(1)
    driver = browser_factory()
    wait = WebDriverWait(driver, 20)
    log_in(driver, live_server, "operator-b")

    # Filter the DLQ, then open the biggest failure group.
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/")
    driver.find_element(By.LINK_TEXT, "t_parked").click()
    wait.until(EC.url_contains("t_parked"))
    docs_screenshot(driver, "dlq-list")
    driver.find_element(By.CSS_SELECTOR, "#failure-groups a.open-group").click()
    wait.until(EC.url_contains("fingerprint="))
    assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 3

    # Open one item, preview the retry, give a reason, confirm.
    with door_forced():
        Task.objects.filter(pk=target.task_id).update(input={"fail": True, "fixed": True})  # the cause was fixed
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/{target.pk}/change/")
    driver.find_element(By.CSS_SELECTOR, "#item-actions a.action-retry").click()
    preview = wait.until(EC.presence_of_element_located((By.ID, "retry-preview")))
    assert len(preview.find_elements(By.CSS_SELECTOR, "tr.skipped")) == 2
    assert len(preview.find_elements(By.CSS_SELECTOR, "tr.runs-again")) == 1
    docs_screenshot(driver, "retry-preview")
    driver.find_element(By.ID, "id_reason").send_keys("upstream fixed in OPS-42")
    driver.find_element(By.ID, "confirm").click()
    message = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success")))
    assert "Retry from checkpoint done" in message.text

    # The worker runs the retry; the item page then shows it resolved and the audit entry.
    wait_for(lambda: Task.objects.get(pk=target.task_id).state == "succeeded", timeout=30, message="retry to succeed")
    assert DLQItem.objects.get(pk=target.pk).status == DLQStatus.RESOLVED
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/{target.pk}/change/")
    rows = driver.find_elements(By.CSS_SELECTOR, "#audit-entries tr.audit-entry")
    assert len(rows) == 1 and "operator-b" in rows[0].text and "upstream fixed in OPS-42" in rows[0].text
    assert AuditEntry.objects.get(target_id=str(target.pk)).client_ip == "127.0.0.1"

    # The task page and the dashboard, for the docs (docs/operate-dlq.md).
    driver.get(f"{live_server.url}/admin/tasks/task/{target.task_id}/change/")
    screenshot(driver, "task-page")
    driver.get(f"{live_server.url}/admin/dashboard/")
    screenshot(driver, "dashboard")


def test_a_viewer_sees_no_action_buttons(browser_factory, live_server, people):
    item = failed_items(1)[0]
    driver = browser_factory()
    log_in(driver, live_server, "viewer-b")
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/{item.pk}/change/")
    assert driver.find_elements(By.CSS_SELECTOR, "#item-actions a") == []
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/")
    assert driver.find_elements(By.ID, "bulk-by-filter") == []
    assert driver.find_elements(By.NAME, "action") == []  # no bulk action menu either


def test_the_console_renders_in_chinese(browser_factory, live_server, people, settings):
    settings.LANGUAGE_CODE = "zh-hans"
    failed_items(1)
    driver = browser_factory(language="zh-CN")
    log_in(driver, live_server, "operator-b")
    driver.get(f"{live_server.url}/admin/dlq/dlqitem/")
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "失败分组" in body  # our own string: "Failure groups"
    assert "可靠性控制台" in driver.title  # the console's name, in Chinese
    screenshot(driver, "dlq-list-zh-hans")
