"""Every console page, read in Simplified Chinese, has no English label left; stored texts follow the reader.

Each page is rendered by the test client with ``Accept-Language: zh-Hans``
over seeded data (dead letters with reasons, an operator's close, a bulk
action, an alert rule that fired with a channel and a delivery, an API
client, refused actions, a purge of the audit log), and its visible text (text nodes, and the title, placeholder,
aria-label and button values) is searched for English words. What may stay
in Latin letters is data and identifiers: pipeline, step and error codes,
ids, usernames, names given by operators, URLs, numbers and dates, and a few
product and protocol names (``ALLOWED_WORDS``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone, translation

from dlq.actions import ActionRefused, dlq_item_act
from dlq.alerting.config_changes import alert_channel_test, alert_config_enabled_set, alert_config_save
from dlq.alerting.models import AlertChannel, AlertEvent, AlertKind, AlertRule
from dlq.alerting.rules import alerts_evaluate
from dlq.approvals import approval_decide
from dlq.audit import audit_entries_purge
from dlq.audit_actions import action_label
from dlq.bulk import bulk_operation_request
from dlq.models import AuditEntry, AuditOutcome, BulkOperation, DLQItem
from tasks import registry
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.clients import api_client_create
from tasks.lifecycle.controls import pipeline_limits_set, pipeline_pause
from tasks.models import ApiClient, Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import aged_audit_entry

pytestmark = pytest.mark.django_db(transaction=True)

# Names of products, protocols and formats, written the same way in Chinese.
ALLOWED_WORDS = {
    "API",
    "DLQ",
    "JSON",
    "HTTP",
    "HMAC",
    "SHA256",
    "URL",
    "UTC",
    "RQ",
    "Redis",
    "PostgreSQL",
    "Slack",
    "Webhook",
    "webhook",
    "Python",
    # Django's boolean icons say True/False in their alt text; its help for multiple selects names the keys.
    "True",
    "False",
    "Control",
    "Command",
    "Mac",
}
# Operator-given names and the seeded data's own English (an exception's message and an effect's name are the
# pipeline's, not ours).
DATA = ("root", "the far side refused", "refused", "charge", "upstream fixed", "ops-log", "open-items-rule")
# A token that holds one of these is an identifier or a number, not a word: t_local, 2026-12-01, 10:31, a@b.c …
IDENTIFIER = re.compile(r"[_\d/:@.=#%?&+]|[A-Za-z]-[A-Za-z]|^-")
WORD = re.compile(r"[A-Za-z]{3,}")
# Latin letters glued to a Chinese character: an English plural or suffix put on a translated name ("API 客户端s",
# what Django writes when a model has no translated verbose_name_plural). Too short for WORD, and never data.
GLUED = re.compile(r"(?<=[\u3400-\u9fff])[A-Za-z]+|[A-Za-z]+(?=[\u3400-\u9fff])")
SHOWN_ATTRIBUTES = ("title", "placeholder", "aria-label", "alt")
SKIPPED_ELEMENTS = {"script", "style", "pre", "code"}


class VisibleText(HTMLParser):
    """The texts a reader sees: text nodes outside scripts, styles and code, and the attributes read aloud."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.skipping: list[str] = []

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag in SKIPPED_ELEMENTS:
            self.skipping.append(tag)
        for name, value in values.items():
            # data-*-label and data-*-text: what the page's scripts show (the dashboard's refresh control).
            shown_by_script = name.startswith("data-") and name.endswith(("-label", "-text"))
            if value and (name in SHOWN_ATTRIBUTES or shown_by_script):
                self.texts.append(value)
        if tag == "input" and values.get("type") in ("submit", "button") and values.get("value"):
            self.texts.append(values["value"])

    def handle_endtag(self, tag):
        if self.skipping and self.skipping[-1] == tag:
            self.skipping.pop()

    def handle_data(self, data):
        if not self.skipping and data.strip():
            self.texts.append(data.strip())


def english_words(html: str, data: tuple[str, ...] = ()) -> set[str]:
    parser = VisibleText()
    parser.feed(html)
    found = set()
    for text in parser.texts:
        for value in sorted((*DATA, *data), key=len, reverse=True):
            text = text.replace(value, " ")
        for token in text.split():
            found.update(f"{token} (glued)" for glued in GLUED.findall(token) if glued not in ALLOWED_WORDS)
            if IDENTIFIER.search(token):
                continue
            found.update(word for word in WORD.findall(token) if word not in ALLOWED_WORDS)
    return found


@pytest.fixture
def seeded(clean_redis):
    """Data on every page: dead letters, an operator action, a bulk action, a fired alert, an API client; live control:
    a cancelled task, a running one asked to stop, a paused pipeline holding a task, a pipeline with its limits
    overridden, and a queued task that may be cancelled."""
    root = get_user_model().objects.create_superuser("root", password="pw-for-tests-only")
    compensated = task_submit(pipeline="t_local", input={"fail_b": "permanent", "topic": "q3"})
    task_run(task_id=str(compensated.pk), worker="w1")
    parked = []
    for _ in range(2):
        task = task_submit(pipeline="t_parked", input={"fail": True, "topic": "q4"})
        task_run(task_id=str(task.pk), worker="w1")
        parked.append(task)
    closed = DLQItem.objects.get(task=parked[1])
    dlq_item_act(item_id=closed.pk, action="close", actor=root, reason="upstream fixed", resolution_code="ignored")
    open_item = DLQItem.objects.get(task=parked[0])
    bulk_operation_request(
        actor=root,
        action="close",
        item_ids=[open_item.pk],
        filter_query="pipeline=t_parked",
        reason="upstream fixed",
        resolution_code="ignored",
    )
    AlertChannel.objects.create(name="ops-log", kind="log")
    AlertRule.objects.create(name="open-items-rule", kind=AlertKind.OPEN_ITEMS, threshold=0)
    AlertRule.objects.create(name="sweeper-rule", kind=AlertKind.SWEEPER_STALLED, threshold=60)
    AlertRule.objects.create(name="approvals-rule", kind=AlertKind.APPROVAL_WAITING, threshold=0)
    alerts_evaluate()
    # Alert configuration changes, each audited with its diff (a credential only as changed), and test sends: one
    # delivered (the log channel), one not (a webhook without a URL), which cannot be switched on either.
    ops_log = AlertChannel.objects.get(name="ops-log")
    alert_config_enabled_set(model=AlertChannel, ids=[ops_log.pk], enabled=False, actor="root")
    edited = AlertRule.objects.get(name="open-items-rule")
    edited.threshold, edited.pipeline = 1, "t_local"
    alert_config_save(record=edited, changed_fields=["threshold", "pipeline"], actor="root")
    hook = AlertChannel(name="ops-hook", kind="webhook", enabled=False, secret="whsec_for_tests_only_0123")
    alert_config_save(record=hook, changed_fields=None, actor="root")
    alert_channel_test(channel=ops_log, actor="root")
    alert_channel_test(channel=hook, actor="root")
    alert_config_enabled_set(model=AlertChannel, ids=[hook.pk], enabled=True, actor="root")
    api_client_create(name="billing-service")
    cancelled = task_submit(pipeline="t_cancellable", input={})
    task_cancel(task_id=cancelled.pk, actor="operator:root", reason="upstream fixed")
    stopping = task_submit(pipeline="t_cancellable", input={})
    task_claim(task_id=str(stopping.pk), owner="w1@host")
    task_cancel(task_id=stopping.pk, actor="client:billing-service", reason="upstream fixed")
    pipeline_pause(pipeline="t_cancellable", actor="operator:root", reason="upstream fixed")
    held = task_submit(pipeline="t_cancellable", input={})
    task_run(task_id=str(held.pk), worker="w1")
    pipeline_limits_set(
        pipeline="t_one_at_a_time", actor="operator:root", reason="upstream fixed", max_concurrency=3, rate_limit="5/s"
    )
    # Refusals, each audited with why: the console's own (the item is resolved already) and the engine's (a task
    # asked to cancel cannot be retried: set by hand, as when a cancel comes while its failing step still runs).
    with pytest.raises(ActionRefused):
        dlq_item_act(item_id=closed.pk, action="retry", actor=root, reason="upstream fixed")
    engine_refused = task_submit(pipeline="t_parked", input={"fail": True, "topic": "q5"})
    task_run(task_id=str(engine_refused.pk), worker="w1")
    with door_forced():
        Task.objects.filter(pk=engine_refused.pk).update(cancel_requested_at=timezone.now(), cancel_requested_by="root")
    with pytest.raises(ActionRefused):
        dlq_item_act(
            item_id=DLQItem.objects.get(task=engine_refused).pk, action="retry", actor=root, reason="upstream fixed"
        )
    # The retention purge of an old entry writes an entry of its own.
    aged_audit_entry(age=timedelta(days=100), actor="root", target_type="dlq_item", target_id="0")
    audit_entries_purge(older_than=timedelta(days=90))
    # The approval inbox: a task waiting at an approval wait, one approved (its entry), a rule on approvals.
    waiting = task_submit(pipeline="t_approval", input={})
    task_run(task_id=str(waiting.pk), worker="w1")
    approved = task_submit(pipeline="t_approval", input={})
    task_run(task_id=str(approved.pk), worker="w1")
    approval_decide(
        task_id=approved.pk, wait="manager_approval", decision="approve", actor=root, reason="upstream fixed"
    )
    # A step that logged more than its attempt keeps, then failed: its log on the task page and the DLQ item's.
    logged = task_submit(pipeline="t_logging", input={"label": "q6", "lines": 300, "fail": True})
    task_run(task_id=str(logged.pk), worker="w1")
    return {
        "waiting": waiting,
        "approved": approved,
        "cancelled": cancelled,
        "stopping": stopping,
        "held": held,
        "queued": task_submit(pipeline="t_local", input={}),
        "item": DLQItem.objects.get(task=compensated),
        "task": Task.objects.get(pk=compensated.pk),
        "closed": closed,
        "engine_refused": Task.objects.get(pk=engine_refused.pk),
        "logged": logged,
        "root": root,
    }


def pages(seeded) -> list[str]:
    item, task = seeded["item"], seeded["task"]
    rule = AlertRule.objects.get(name="open-items-rule")
    return [
        "/admin/",
        "/admin/dashboard/",
        "/admin/queues/",
        "/admin/dlq/dlqitem/",
        "/admin/dlq/dlqitem/?status=open",
        f"/admin/dlq/dlqitem/{item.pk}/change/",
        f"/admin/dlq/dlqitem/{item.pk}/act/retry/",
        f"/admin/dlq/dlqitem/{item.pk}/act/close/",
        f"/admin/dlq/dlqitem/selected/compensate/?ids={item.pk}",
        "/admin/dlq/dlqitem/bulk/close/?status=open",
        "/admin/tasks/task/",
        f"/admin/tasks/task/{task.pk}/change/",
        f"/admin/tasks/task/{seeded['closed'].task_id}/change/",  # with an audit entry
        f"/admin/dlq/dlqitem/{seeded['closed'].pk}/change/",
        "/admin/dlq/bulkoperation/",
        f"/admin/dlq/bulkoperation/{BulkOperation.objects.get().pk}/change/",
        "/admin/dlq/auditentry/",
        f"/admin/dlq/auditentry/{AuditEntry.objects.filter(action='close').first().pk}/change/",
        "/admin/dlq/alertrule/",
        f"/admin/dlq/alertrule/{rule.pk}/change/",
        "/admin/dlq/alertchannel/",
        f"/admin/dlq/alertchannel/{AlertChannel.objects.get(name='ops-log').pk}/change/",
        "/admin/dlq/alertevent/",
        f"/admin/dlq/alertevent/{AlertEvent.objects.filter(rule=rule).first().pk}/change/",
        "/admin/tasks/apiclient/",
        f"/admin/tasks/apiclient/{ApiClient.objects.get().pk}/change/",
        # Live control: the task pages of a cancelled, a stopping and a held task; the cancel confirmation; the
        # Pipelines page and the confirmation of each of its actions; audit entries of a cancel and a limits change.
        f"/admin/tasks/task/{seeded['cancelled'].pk}/change/",
        f"/admin/tasks/task/{seeded['stopping'].pk}/change/",
        f"/admin/tasks/task/{seeded['held'].pk}/change/",
        f"/admin/tasks/task/{seeded['queued'].pk}/act/cancel/",
        f"/admin/tasks/task/{seeded['cancelled'].pk}/act/cancel/",
        "/admin/pipelines/",
        "/admin/pipelines/t_local/act/pause/",
        "/admin/pipelines/t_cancellable/act/resume/",
        "/admin/pipelines/t_one_at_a_time/act/set_limits/",
        "/admin/pipelines/t_one_at_a_time/act/reset_limits/",
        f"/admin/dlq/auditentry/{AuditEntry.objects.filter(action='task_cancelled').first().pk}/change/",
        f"/admin/dlq/auditentry/{AuditEntry.objects.get(action='pipeline_limits_set').pk}/change/",
        "/admin/dlq/auditentry/?target_type=pipeline",
        # Entries whose detail the console writes: refusals (the console's, the engine's), a bulk request, a purge;
        # the pages that list the refusals with their detail.
        *(f"/admin/dlq/auditentry/{pk}/change/" for pk in refusals()),
        f"/admin/dlq/auditentry/{AuditEntry.objects.get(action='bulk_request').pk}/change/",
        f"/admin/dlq/auditentry/{AuditEntry.objects.get(action='audit_purged').pk}/change/",
        f"/admin/tasks/task/{seeded['engine_refused'].pk}/change/",
        f"/admin/dlq/dlqitem/{DLQItem.objects.get(task=seeded['engine_refused']).pk}/change/",
        "/admin/dlq/auditentry/?outcome=refused",
        # What a step logged: under its attempt on the task page, the failing attempt's on the item page.
        f"/admin/tasks/task/{seeded['logged'].pk}/change/",
        f"/admin/dlq/dlqitem/{DLQItem.objects.get(task=seeded['logged']).pk}/change/",
        # The approval inbox, its confirmation pages (one for a task no longer waiting), a decision's entry.
        "/admin/approvals/",
        "/admin/approvals/?pipeline=nothing-here",
        f"/admin/approvals/{seeded['waiting'].pk}/manager_approval/approve/",
        f"/admin/approvals/{seeded['waiting'].pk}/manager_approval/reject/",
        f"/admin/approvals/{seeded['approved'].pk}/manager_approval/approve/",
        f"/admin/dlq/auditentry/{AuditEntry.objects.get(action='approval_approved').pk}/change/",
        # Alert rule and channel changes: their lists and each entry's page with its diff or test outcome.
        "/admin/dlq/auditentry/?target_type=alert_rule",
        "/admin/dlq/auditentry/?target_type=alert_channel",
        *(
            f"/admin/dlq/auditentry/{pk}/change/"
            for pk in AuditEntry.objects.filter(target_type__in=("alert_rule", "alert_channel")).values_list(
                "pk", flat=True
            )
        ),
    ]


def refusals() -> list[int]:
    pks = list(
        AuditEntry.objects.filter(outcome=AuditOutcome.REFUSED, target_type="dlq_item").values_list("pk", flat=True)
    )
    assert len(pks) == 2
    return pks


def test_every_console_page_is_in_chinese(client, seeded):
    client.force_login(seeded["root"])
    # Rules and channels are named by operators (the default ones too): data, not labels.
    names = (*AlertRule.objects.values_list("name", flat=True), *AlertChannel.objects.values_list("name", flat=True))
    names += tuple(settings.RQ_QUEUES)  # queue names ("default") are identifiers of the configuration
    names += tuple(pipeline.name for pipeline in registry.all_pipelines())  # so are pipeline names ("report")
    # Task ids, whole and as the lists show them (their first 8 hex digits): one whose 8 are all letters a to f
    # (about 1 in 2,600) would read as a word ("cfaddebc") and fail the page at random.
    ids = [str(pk) for pk in Task.objects.values_list("pk", flat=True)]
    names += (*ids, *(task_id[:8] for task_id in ids))
    untranslated = {}
    for url in pages(seeded):
        response = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans")
        assert response.status_code == 200, url
        body = response.content.decode()
        words = english_words(body, names)
        if "<title>" not in body or "可靠性控制台" not in body.split("</title>")[0]:
            words.add("<title> without the console's Chinese name")
        if words:
            untranslated[url] = sorted(words)
    assert not untranslated, "untranslated:\n" + "\n".join(
        f"{url}: {' '.join(words)}" for url, words in untranslated.items()
    )


def test_the_detector_finds_english_and_lets_identifiers_through():
    html = (
        '<p>死信 t_local:local_b:refused 2026-12-01 10:31</p><input type="submit" value="Save">'
        '<a title="Open the item">x</a><pre>{"topic": "q3"}</pre><script>var refresh = 1;</script>'
    )
    assert english_words(html) == {"Save", "Open", "the", "item"}
    # An English plural on a translated model name, as Django builds it without a verbose_name_plural.
    assert english_words("<h1>选择 API 客户端s 来修改</h1><p>共 3 个DLQ条目</p>") == {"客户端s (glued)"}


def test_the_same_dead_letter_reads_in_english_and_in_chinese(client, seeded):
    client.force_login(seeded["root"])
    item = seeded["item"]
    url = f"/admin/dlq/dlqitem/{item.pk}/change/"
    english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    chinese = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert "Step &#x27;local_b&#x27; failed with a permanent error (refused): refused" in english
    assert "步骤" in chinese and "Step &#x27;local_b&#x27;" not in chinese
    # Stored once, language-neutral: a code and its parameters (and the English copy for old readers).
    stored = DLQItem.objects.get(pk=item.pk)
    assert stored.reason_code == "permanent_error"
    assert stored.reason_params == {
        "step": "local_b",
        "code": "refused",
        "message": "refused",
        "attempts": 2,
        "crashes": 0,
    }
    with translation.override("zh-hans"):
        assert stored.reason_shown.startswith("步骤")


def test_an_item_written_before_reason_parameters_existed_shows_its_stored_reason(client, seeded):
    client.force_login(seeded["root"])
    item = seeded["item"]
    with door_forced():
        DLQItem.objects.filter(pk=item.pk).update(reason_params={}, reason="an older release wrote this")
    page = client.get(f"/admin/dlq/dlqitem/{item.pk}/change/", HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert "an older release wrote this" in page


def test_audit_details_are_stored_as_codes_and_read_in_each_readers_language(client, seeded):
    client.force_login(seeded["root"])
    refused = AuditEntry.objects.get(outcome=AuditOutcome.REFUSED, target_id=str(seeded["closed"].pk))
    engine = AuditEntry.objects.get(outcome=AuditOutcome.REFUSED, task_id=seeded["engine_refused"].pk)
    bulk = AuditEntry.objects.get(action="bulk_request")
    purge = AuditEntry.objects.get(action="audit_purged")
    # Stored once, language-neutral: a code and its facts (the engine's refusal by the engine's code), and the
    # English sentence for readers of the column alone.
    assert [(e.detail_code, e.detail_params) for e in (refused, engine, bulk)] == [
        ("item_resolved", {}),
        ("retry_cancelled", {}),
        ("bulk_items", {"action": "close", "total": 1}),
    ]
    assert (purge.detail_code, purge.detail_params["count"], purge.detail_params["days"]) == ("audit_purged", 1, "90")
    assert (bulk.detail, refused.detail) == ("Close on 1 item", "this dead letter was already resolved")
    for entry, english, chinese in (
        (refused, "this dead letter was already resolved", "该死信已被解决"),
        (engine, "the task was cancelled: compensate it or close its dead letter", "任务已被取消：请对其进行补偿"),
        (bulk, "Close on 1 item", "对 1 个条目执行“关闭”"),
        (purge, "1 entry created before", "之前创建的 1 条记录（超过 90 天）"),
    ):
        url = f"/admin/dlq/auditentry/{entry.pk}/change/"
        shown_in_english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
        shown_in_chinese = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
        assert english in shown_in_english and chinese in shown_in_chinese and english not in shown_in_chinese, url


def test_audit_entries_written_before_detail_codes_show_their_stored_detail(client, seeded):
    client.force_login(seeded["root"])

    def written(detail: str, **fields) -> str:
        entry = AuditEntry.objects.create(
            actor="root",
            action="close",
            target_type="dlq_item",
            target_id="1",
            outcome="refused",
            detail=detail,
            **fields,
        )
        return client.get(f"/admin/dlq/auditentry/{entry.pk}/change/", HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()

    assert "close on 3 items" in written("close on 3 items")  # a sentence: as stored
    assert "无权限" in written("permission denied")  # a fixed phrase, and a resolution code: translated
    assert "已忽略" in written("ignored")
    # A code this release cannot word (a newer engine's refusal): its stored English.
    assert "the engine said no" in written("the engine said no", detail_code="newer_refusal", detail_params={"x": 1})


def test_alert_summaries_read_in_english_and_in_chinese(client, seeded):
    client.force_login(seeded["root"])
    event = AlertEvent.objects.get(rule__name="open-items-rule")
    assert event.summary_code == "open_items" and event.summary_params["count"] == 2
    url = f"/admin/dlq/alertevent/{event.pk}/change/"
    english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    chinese = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert "2 open DLQ items in all pipelines (limit 0)" in english
    assert "所有流水线中有 2 个待处理死信条目（上限 0）" in chinese
    assert "2 open DLQ items" not in chinese.split('<pre class="rc-json"')[0]
    # The notification sent to receivers keeps the English text stored with the event; the page shows it as JSON.
    assert event.summary == "2 open DLQ items in all pipelines (limit 0)"
    assert "&quot;summary&quot;: &quot;2 open DLQ items in all pipelines (limit 0)&quot;" in chinese
    assert "{&#x27;" not in chinese


def test_json_is_shown_indented_never_as_a_python_repr(client, seeded):
    client.force_login(seeded["root"])
    item, task = seeded["item"], seeded["task"]
    for url in (f"/admin/dlq/dlqitem/{item.pk}/change/", f"/admin/tasks/task/{task.pk}/change/"):
        body = client.get(url).content.decode()
        assert "{&#x27;topic&#x27;" not in body and "{'topic'" not in body, url
        assert "&quot;topic&quot;: &quot;q3&quot;" in body, url
        assert "{\n  &quot;fail_b&quot;: &quot;permanent&quot;,\n  &quot;topic&quot;" in body, url


@pytest.mark.parametrize(
    ("code", "english", "chinese"),
    [
        ("bulk_request", "Request bulk action", "请求批量操作"),
        ("bulk_complete", "Bulk action completed", "批量操作已完成"),
        ("audit_purged", "Audit entries purged", "已清除审计记录"),
        ("bulk_close", "Bulk: Close", "批量：关闭"),
        ("delete_alertrule", "Delete alert rule", "删除"),
    ],
)
def test_the_audit_logs_action_names_are_worded_in_the_readers_language(code, english, chinese):
    with translation.override("en"):
        assert action_label(code) == english
    with translation.override("zh-hans"):
        assert action_label(code).startswith(chinese)
        assert action_label("no_such_action") == "no_such_action"
