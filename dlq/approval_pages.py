"""The approval inbox: tasks waiting for a person's decision, and the confirmation pages that approve or reject one.

The inbox (``/admin/approvals/``, ``tasks.view_task``, so every role) lists the tasks waiting at an approval wait
(``Pipeline.wait(..., approval=True)``), the longest waiting first, a page at a time: the task's input and its
earlier steps' outputs, redacted as the task page shows them, since when it waits and until when (its timeout).
A page is three queries whatever its length (the count, the page, the page's checkpoints). Operators and
supervisors (``dlq.decide_approval``) get Approve and Reject: a confirmation page on GET, the decision on POST
through ``dlq.approvals.approval_decide``, then a message and a redirect to the inbox. A POST without the
permission is a 403 and an audit entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache

from dlq.admin.common import action_page, client_ip, deny
from dlq.admin.task_pages import JsonBlock, redacted_json_block
from dlq.approvals import DECIDE_PERMISSION, DECISIONS, Decision, approval_decide
from tasks import registry
from tasks.exceptions import UnknownPipeline
from tasks.models import Task
from tasks.selectors import approval_wait_of, approval_waiting_tasks, approval_waits, checkpoints_of

# Tasks per page of the inbox.
PAGE_SIZE = 25
# A list shows the start of each input and output; the task page shows them whole.
MAX_LIST_JSON_CHARACTERS = 2000
# The longest pipeline name a filter may carry (Task.pipeline's max_length): a longer one matches nothing anyway.
MAX_PIPELINE_LENGTH = 100
DONE_MESSAGES = {
    "approve": _("Task %(task)s approved at %(wait)s: it goes on."),
    "reject": _("Task %(task)s rejected at %(wait)s: it goes on with the rejection as the wait's answer."),
}


@dataclass(frozen=True)
class InboxRow:
    task: Task
    wait: str
    input: JsonBlock
    outputs: list[tuple[str, JsonBlock]]  # (step name, its output), in step order
    timeout_seconds: float | None
    decisions: list[tuple[str, str, str]]  # (name, label, confirmation page URL), for those who may decide


def _timeout(pipeline: str, wait: str) -> float | None:
    try:
        step = registry.get(pipeline).wait_step(wait)
    except UnknownPipeline:
        return None
    return step.wait.timeout if step is not None else None


def _decisions(task: Task, wait: str, user) -> list[tuple[str, str, str]]:
    if not user.has_perm(DECIDE_PERMISSION):
        return []
    return [
        (name, str(spec.label), reverse("approval_decide", args=[task.pk, wait, name]))
        for name, spec in DECISIONS.items()
    ]


def inbox_rows(tasks: list[Task], user) -> list[InboxRow]:
    """The inbox's rows for a page of ``tasks`` (annotated with ``wait_name``): one query, for their checkpoints."""
    checkpoints = checkpoints_of(task_ids=[task.pk for task in tasks])
    rows = []
    for task in tasks:
        outputs = [
            (checkpoint.step_name, redacted_json_block(checkpoint.output, task, limit=MAX_LIST_JSON_CHARACTERS))
            for checkpoint in checkpoints.get(str(task.pk), [])
        ]
        rows.append(
            InboxRow(
                task=task,
                wait=task.wait_name,
                input=redacted_json_block(task.input, task, limit=MAX_LIST_JSON_CHARACTERS),
                outputs=outputs,
                timeout_seconds=_timeout(task.pipeline, task.wait_name),
                decisions=_decisions(task, task.wait_name, user),
            )
        )
    return rows


@staff_member_required
@permission_required("tasks.view_task", raise_exception=True)
@never_cache
def approvals(request: HttpRequest) -> HttpResponse:
    """The tasks waiting for a person's decision, the longest waiting first; ``?pipeline=`` filters, ``?p=`` pages."""
    pipelines = sorted(approval_waits())
    pipeline = request.GET.get("pipeline", "")[:MAX_PIPELINE_LENGTH]
    unknown_pipeline = bool(pipeline) and pipeline not in pipelines
    page = Paginator(approval_waiting_tasks(pipeline=pipeline or None), PAGE_SIZE).get_page(request.GET.get("p"))
    context = {
        **admin.site.each_context(request),
        "title": _("Approval inbox"),
        "pipelines": pipelines,
        "pipeline": pipeline,
        "unknown_pipeline": unknown_pipeline,
        "page": page,
        "rows": inbox_rows(list(page.object_list), request.user),
        "filter_query": urlencode({"pipeline": pipeline}) if pipeline else "",
        "may_decide": request.user.has_perm(DECIDE_PERMISSION),
    }
    return TemplateResponse(request, "admin/approvals.html", context)


@staff_member_required
@never_cache
def approval_decide_page(request: HttpRequest, task_id, wait: str, decision: str) -> HttpResponse:
    """GET: the task, its wait and a reason form. POST: approve or reject, then message and redirect to the inbox."""
    spec = DECISIONS.get(decision)
    if spec is None:
        raise Http404("unknown decision")
    if not request.user.has_perm(DECIDE_PERMISSION):
        deny(request, action=spec.audit_action, target_type="task", target_id=task_id)
    task = get_object_or_404(Task, pk=task_id)
    inbox_url = reverse("approvals")
    return action_page(
        request,
        lambda: approval_decide(
            task_id=task.pk,
            wait=wait,
            decision=spec.name,
            actor=request.user,
            reason=request.POST.get("reason", ""),
            client_ip=client_ip(request),
        ),
        template="admin/approval_confirm.html",
        title=_decision_title(spec, wait),
        page_context=lambda: {
            "spec": spec,
            "task": task,
            "wait": wait,
            "available": approval_wait_of(task) == wait,
            "input_json": redacted_json_block(task.input, task, limit=MAX_LIST_JSON_CHARACTERS),
        },
        done_url=inbox_url,
        done_message=lambda result: DONE_MESSAGES[spec.name] % {"task": task.pk, "wait": wait},
        return_url=inbox_url,
    )


def _decision_title(spec: Decision, wait: str) -> Any:
    return _("%(decision)s: wait %(wait)s") % {"decision": spec.label, "wait": wait}
