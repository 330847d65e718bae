"""The approval inbox and the schedules pages in a real browser, in English and in Chinese (issue 42, point 6):
a supervisor approves a waiting task from the inbox and pauses a schedule, each through its confirmation page
with a reason, and reads the outcome in the reader's language. Writes the docs' screenshots
(``docs/screenshots/approvals*.png``, ``schedules*.png``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dlq.models import AuditEntry, AuditOutcome
from dlq.roles import roles_setup
from tasks import Pipeline, Schedule, registry
from tasks.execution.runner import task_run
from tasks.lifecycle import schedule_add
from tasks.lifecycle.schedules import schedules_sync
from tasks.models import PipelineSchedule, Task, TaskState
from tasks.submission.submit import task_submit
from tests.browser.conftest import PASSWORD, docs_screenshot, log_in
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

WAIT = "manager_approval"
TEXTS = {
    "en": {
        "browser": "en-US",
        "inbox": "Approval inbox",
        "approve": "Approve",
        "approved": "approved at manager_approval: it goes on.",
        "schedules": "Schedules",
        "paused_message": "Schedule nightly-digest paused: none of its slots fires until it is resumed.",
        "paused": "paused",
    },
    "zh-hans": {
        "browser": "zh-CN",
        "inbox": "审批收件箱",
        "approve": "批准",
        "approved": "已在 manager_approval 处批准：它将继续执行。",
        "schedules": "计划",
        "paused_message": "计划 nightly-digest 已暂停：在恢复之前，它的时间点都不会触发。",
        "paused": "已暂停",
    },
}


@pytest.fixture
def pages(clean_redis):
    """A supervisor; two tasks waiting at an approval wait; a schedule declared in code and one added here."""
    roles_setup()
    user = get_user_model().objects.create_user("supervisor-s", password=PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get(name="supervisor"))
    waiting = []
    for amount, customer in ((25, "c-1001"), (140, "c-2002")):
        task = task_submit(pipeline="t_approval", input={"amount": amount, "customer": customer})
        assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
        waiting.append(task)
    pipeline = Pipeline("b_digest", schedules=[Schedule(cron="0 6 * * *", name="nightly-digest")])
    pipeline.step(lambda ctx: None, name="send")
    schedules_sync()
    schedule_add(
        name="hourly-report",
        pipeline="b_digest",
        every=timedelta(hours=1),
        input={"region": "eu"},
        actor="operator:supervisor-s",
        reason="the EU team asked for hourly reports",
    )
    yield {"waiting": waiting, "schedule": PipelineSchedule.objects.get(name="nightly-digest")}
    registry.unregister("b_digest")


def fits(driver) -> bool:
    viewport = driver.execute_script("return document.documentElement.clientWidth")
    return driver.execute_script("return document.documentElement.scrollWidth") <= viewport


def confirm_with_reason(driver, wait, reason: str) -> str:
    """Fill in the confirmation page's reason, confirm, and return the success message shown after."""
    wait.until(EC.presence_of_element_located((By.ID, "id_reason"))).send_keys(reason)
    driver.find_element(By.ID, "confirm").click()
    return wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success"))).text


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_a_supervisor_approves_from_the_inbox_and_pauses_a_schedule(browser_factory, live_server, pages, language):
    texts = TEXTS[language]
    suffix = "" if language == "en" else "-zh-hans"
    driver = browser_factory(language=texts["browser"])
    wait = WebDriverWait(driver, 20)
    log_in(driver, live_server, "supervisor-s")

    # The inbox: both waiting tasks, their input as indented JSON, the draft step's output, the decisions.
    driver.get(f"{live_server.url}/admin/approvals/")
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == language
    assert texts["inbox"] in driver.find_element(By.ID, "content").text
    first, second = pages["waiting"]
    rows = driver.find_elements(By.CSS_SELECTOR, "#approvals-table tr.rc-approval")
    assert [row.get_attribute("id") for row in rows] == [f"approval-{first.pk}", f"approval-{second.pk}"]
    row = driver.find_element(By.ID, f"approval-{second.pk}")
    assert '"customer": "c-2002"' in row.find_element(By.CSS_SELECTOR, ".approval-input").text
    assert "draft_refund" in row.find_element(By.CSS_SELECTOR, ".approval-outputs").text
    assert texts["approve"] in row.find_element(By.CSS_SELECTOR, "a.decision-approve").text
    assert fits(driver)
    docs_screenshot(driver, f"approvals{suffix}")

    # Approve the second through its confirmation page: back on the inbox with the outcome; the task goes on.
    row.find_element(By.CSS_SELECTOR, "a.decision-approve").click()
    assert '"customer": "c-2002"' in wait.until(EC.presence_of_element_located((By.ID, "approval-input"))).text
    message = confirm_with_reason(driver, wait, "refund within policy")
    assert f"{second.pk}" in message and texts["approved"] in message, message
    assert [row.get_attribute("id") for row in driver.find_elements(By.CSS_SELECTOR, "tr.rc-approval")] == [
        f"approval-{first.pk}"
    ]
    after = wait_for(lambda: Task.objects.filter(pk=second.pk).exclude(state=TaskState.WAITING).first(), timeout=10)
    assert after.state in (TaskState.QUEUED, TaskState.RUNNING, TaskState.SUCCEEDED)

    # The schedules: the code one and the one added here, with their definitions and actions.
    schedule = pages["schedule"]
    driver.get(f"{live_server.url}/admin/schedules/")
    assert texts["schedules"] in driver.find_element(By.ID, "content").text
    table = driver.find_element(By.ID, "schedules-table").text
    assert "nightly-digest" in table and "hourly-report" in table and "b_digest" in table
    assert fits(driver)
    docs_screenshot(driver, f"schedules{suffix}")

    # Pause the code schedule: the message and its row say so, in the reader's language; the pause is audited.
    driver.find_element(By.ID, f"schedule-{schedule.pk}-pause").click()
    message = confirm_with_reason(driver, wait, "the digest service is down for maintenance")
    assert message == texts["paused_message"], message
    state = driver.find_element(By.CSS_SELECTOR, f"#schedule-{schedule.pk} .schedule-state").text
    assert state == texts["paused"], state
    assert PipelineSchedule.objects.get(pk=schedule.pk).paused
    assert AuditEntry.objects.filter(
        action="schedule_paused", target_id="nightly-digest", outcome=AuditOutcome.SUCCEEDED
    ).exists()
