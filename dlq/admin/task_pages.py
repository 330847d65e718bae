"""The engine's tasks and API clients in the console: a task list that stays fast on millions of tasks,
one page per task, and the API clients (revoke only).

Nobody edits a task's fields by hand: state changes go through services (the
DLQ actions, and the cancel of a live task: ``dlq.live_actions``), so every
write permission is refused and a POST to a task page is a 403. Every filter and search below is backed by an index (see
``tasks/migrations/0005_task_search_indexes.py``); the list never counts the
whole table and loads only the columns it shows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import F, Q
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from dlq.actions import MAX_REASON_LENGTH
from dlq.admin.common import DenialsAuditedMixin, ServiceViewMixin, client_ip, deny, selected_row_ids
from dlq.alerting.masking import secret_masked
from dlq.audit_actions import TASK_CANCELLED
from dlq.audit_details import refusal_detail
from dlq.conf import console_settings
from dlq.lifecycle import lifecycle_svg
from dlq.live_actions import CANCEL_PERMISSION, operator_actor, task_cancel_by_operator, task_cancellable
from dlq.models import AuditEntry
from dlq.selectors import attempt_logs
from reliability_console.admin_mixins import AgeFilter, DistinctValueFilter, PipelineFilter, ReadOnlyAdminMixin
from reliability_console.json_display import json_text
from reliability_console.paginator import CappedCountPaginator
from tasks import registry
from tasks.exceptions import UnknownPipeline
from tasks.lifecycle import MANAGE_PERMISSION, ApiClientError, CancelResult, api_client_revoke
from tasks.models import (
    ApiClient,
    AttemptKind,
    Checkpoint,
    FailureReason,
    SideEffect,
    StepAttempt,
    Task,
    TaskHold,
    TaskState,
)
from tasks.redaction import task_redactor
from tasks.selectors import ATTRIBUTE_VALUE_MAX, attribute_condition, attribute_search

# Columns the list loads: never the input, result or error message, which may be large.
LIST_COLUMNS = ("id", "pipeline", "state", "current_step", "total_steps", "failure_reason", "created_at")
# Shorter search terms would match through a trigram index poorly (pg_trgm needs 3 characters).
MIN_MESSAGE_SEARCH_LENGTH = 3
# A filter offers at most this many distinct pipelines or steps.
# Bounds on one task page; a task reaching them is cut, with a note, rather than making the page slow.
MAX_TIMELINE_ROWS = 1000
MAX_AUDIT_ROWS = 200
MAX_JSON_CHARACTERS = 20_000


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return TaskState.choices

    def queryset(self, request, queryset):
        if self.value() in TaskState.values:
            return queryset.filter(state=self.value())
        return queryset


class FailedStepFilter(DistinctValueFilter):
    title = _("failing step")
    parameter_name = "failed_step"


class TaskChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        return super().get_queryset(request, exclude_parameters).only(*LIST_COLUMNS)

    def get_ordering(self, request, queryset):
        ordering = super().get_ordering(request, queryset)
        # Django drops an "o=" it cannot use and orders by the primary key
        # alone: with a filter, PostgreSQL would then read the table in id
        # order to find a page. Every order here starts with the creation time.
        if not ordering or str(ordering[0]).lstrip("-") != "created_at":
            return ["-created_at", "-pk"]
        return ordering


@dataclass(frozen=True)
class JsonBlock:
    text: str
    truncated: bool


def redacted_json_block(value: Any, task: Task, *, limit: int = MAX_JSON_CHARACTERS) -> JsonBlock:
    """``value`` redacted (with ``task``'s input secrets) and pretty-printed for a page, cut past ``limit``."""
    text = json_text(task_redactor(task).value(value))
    if len(text) > limit:
        return JsonBlock(text[:limit], True)
    return JsonBlock(text, False)


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    status: str  # done, failed, cancelled, next or pending


def _step_rows(task: Task, attempts: list[StepAttempt], checkpoints: list[Checkpoint]) -> list[StepRow]:
    try:
        # The names the task recorded (current_step indexes them); the declaration for rows without them.
        names = list(task.step_names) or [step.name for step in registry.get(task.pipeline).steps]
    except UnknownPipeline:
        # The pipeline is no longer registered here: name the steps from what ran.
        known = {checkpoint.step_index: checkpoint.step_name for checkpoint in checkpoints}
        known.update({a.step_index: a.step_name for a in attempts if a.kind == AttemptKind.STEP})
        names = [known.get(index, "?") for index in range(max(task.total_steps, len(known)))]
    failed = task.state in (
        TaskState.FAILED,
        TaskState.COMPENSATING,
        TaskState.COMPENSATED,
        TaskState.COMPENSATION_FAILED,
    )
    # Stopped by a cancel (it may be undoing its steps, or have failed to): where it stopped, not a failure.
    cancelled = task.failure_reason == FailureReason.CANCELLED
    rows = []
    for index, name in enumerate(names):
        if index < task.current_step:
            status = "done"
        elif index == task.current_step and cancelled:
            status = "cancelled"
        elif index == task.current_step and failed:
            status = "failed"
        elif index == task.current_step and task.state != TaskState.SUCCEEDED:
            status = "next"
        else:
            status = "pending"
        rows.append(StepRow(index, name, status))
    return rows


def task_page_context(task: Task) -> dict[str, Any]:
    """Everything the task page shows besides the task's own fields (a bounded number of queries)."""
    attempts = list(
        StepAttempt.objects.filter(task_id=task.pk)
        .defer("traceback", "log")  # the traceback stays on the server; the logs come bounded, below
        .order_by(F("started_at").asc(nulls_last=True), "id")[: MAX_TIMELINE_ROWS + 1]
    )
    logs = attempt_logs(task_id=task.pk)
    for attempt in attempts:
        attempt.log_shown = logs.get(attempt.pk)
    checkpoints = list(Checkpoint.objects.filter(task_id=task.pk).order_by("step_index"))
    audit_entries = list(
        AuditEntry.objects.filter(task_id=task.pk).order_by("-created_at", "-id")[: MAX_AUDIT_ROWS + 1]
    )
    total = task.total_steps
    done = min(task.current_step, total) if total else 0
    return {
        "task": task,
        # Built from constants only, every label escaped: no user data reaches it.
        "lifecycle_svg": mark_safe(lifecycle_svg(task.state)),
        "progress_done": done,
        "progress_total": total,
        "progress_percent": round(100 * done / total) if total else 0,
        "steps": _step_rows(task, attempts, checkpoints),
        "attempts": attempts[:MAX_TIMELINE_ROWS],
        "attempts_truncated": len(attempts) > MAX_TIMELINE_ROWS,
        "checkpoints": [(checkpoint, redacted_json_block(checkpoint.output, task)) for checkpoint in checkpoints],
        "side_effects": list(SideEffect.objects.filter(task_id=task.pk).order_by("generation", "step_index", "id")),
        "dlq_items": list(task.dlq_items.order_by("-created_at")),
        "audit_entries": audit_entries[:MAX_AUDIT_ROWS],
        "audit_truncated": len(audit_entries) > MAX_AUDIT_ROWS,
        "input_json": redacted_json_block(task.input, task),
        "result_json": redacted_json_block(task.result, task) if task.result is not None else None,
        "held": task.state == TaskState.QUEUED and task.hold != TaskHold.NONE,
        "trace_url": trace_url(task),
    }


def trace_url(task: Task) -> str:
    """The link to the task's trace in the tracing UI (``RELIABILITY_TRACE_URL``); "" without a trace or a UI."""
    template, trace_id = console_settings.TRACE_URL, task.trace_id
    return template.format(trace_id=trace_id) if template and trace_id else ""


def attribute_searched(request, queryset, name: str, value: str, *, of_task: bool = False):
    """The rows whose task has the search attribute ``name`` = ``value`` (exact); a value too long for one is
    told and finds nothing. Composes with the list's filters, as any search does.

    ``of_task``: the rows are a task's (dead letters): their tasks are found first, through the attributes'
    GIN index, then the rows by their task (a join would let the planner walk the rows in the list's order
    and test each one's task: 8 s for a customer among 5 M tasks, `make bench`).
    """
    if len(value) > ATTRIBUTE_VALUE_MAX:
        messages.warning(
            request,
            _("A search attribute's value is at most %(max)d characters: nothing matches %(name)s.")
            % {"max": ATTRIBUTE_VALUE_MAX, "name": name},
        )
        return queryset.none()
    if of_task:
        return queryset.filter(task_id__in=Task.objects.filter(attribute_condition(name, value)).values("pk"))
    return queryset.filter(attribute_condition(name, value))


@admin.register(Task)
class TaskAdmin(DenialsAuditedMixin, ServiceViewMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("task_id", "pipeline_name", "state_badge", "progress", "failure", "created")
    list_filter = (StateFilter, PipelineFilter, FailedStepFilter, AgeFilter)
    # Only the creation time has an index the list can walk in order.
    sortable_by = ("created",)
    # Shown for the search box; get_search_results does the searching, through indexes.
    search_fields = ("=id", "=idempotency_key", "=failure_code", "failure_message")
    search_help_text = _(
        "Task id, idempotency key, error code, part of an error message, or a search attribute as name:value "
        "(order_id:A1001)."
    )
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would count millions of rows
    list_select_related = False  # no related object is shown in the list
    # The page shows the task through its own template (change_form.html); the
    # form only carries the id, and no field can be written.
    fields = ("id",)
    readonly_fields = ("id",)

    def get_changelist(self, request, **kwargs):
        return TaskChangeList

    def get_search_results(self, request, queryset, search_term):
        """Exact id, exact idempotency key, exact error code, or part of the error message.

        Each alternative has its own index, so PostgreSQL combines them with a
        bitmap OR; a term that is not a UUID simply matches no id.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        attribute = attribute_search(term)
        if attribute is not None:
            return attribute_searched(request, queryset, *attribute), False
        condition = Q(idempotency_key=term) | Q(failure_code=term)
        try:
            condition |= Q(pk=uuid.UUID(term))
        except ValueError:
            pass
        if len(term) >= MIN_MESSAGE_SEARCH_LENGTH:
            condition |= Q(failure_message__icontains=term)
        return queryset.filter(condition), False

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(task_page_context(obj))
            if request.user.has_perm(CANCEL_PERMISSION) and task_cancellable(obj):
                context["cancel_url"] = reverse("admin:tasks_task_cancel", args=[obj.pk])
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<uuid:task_id>/act/cancel/", view(self.cancel_view), name="tasks_task_cancel"),
            *super().get_urls(),
        ]

    def cancel_view(self, request, task_id):
        """GET: what a cancel does to this task, and a reason form. POST: cancel it, then message and redirect."""
        if not request.user.has_perm(CANCEL_PERMISSION):
            deny(request, action=TASK_CANCELLED, target_type="task", target_id=task_id)
        task = get_object_or_404(Task, pk=task_id)
        task_url = reverse("admin:tasks_task_change", args=[task.pk])
        error = ""
        if request.method == "POST":
            cancel = partial(
                task_cancel_by_operator,
                task_id=task.pk,
                actor=request.user,
                reason=request.POST.get("reason", ""),
                client_ip=client_ip(request),
            )
            error = self.perform(
                request, cancel, done_url=task_url, done_message=_cancelled_message, refused_url=task_url
            )
            if not isinstance(error, str):
                return error
        context = {
            **self.admin_site.each_context(request),
            "title": _("Cancel task"),
            "opts": self.model._meta,
            "task": task,
            "available": task_cancellable(task),
            "running": task.state == TaskState.RUNNING,
            "error": error,
            # Shown again after a form error: never more than may be stored.
            "reason": request.POST.get("reason", "")[:MAX_REASON_LENGTH],
            "cancel_url": task_url,
        }
        return TemplateResponse(request, "admin/tasks/task/confirm_cancel.html", context, status=400 if error else 200)

    @admin.display(description=_("task"))
    def task_id(self, obj: Task) -> str:
        return str(obj.pk)

    @admin.display(description=_("pipeline"))
    def pipeline_name(self, obj: Task) -> str:
        return obj.pipeline

    @admin.display(description=_("state"))
    def state_badge(self, obj: Task) -> str:
        return format_html('<span class="rc-state rc-state-{}">{}</span>', obj.state, obj.get_state_display())

    @admin.display(description=_("progress"))
    def progress(self, obj: Task) -> str:
        return f"{min(obj.current_step, obj.total_steps)}/{obj.total_steps}"

    @admin.display(description=_("failure reason"))
    def failure(self, obj: Task) -> str:
        return obj.get_failure_reason_display()

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Task):
        return obj.created_at


def _cancelled_message(result: CancelResult) -> tuple[int, str]:
    task = result.task
    if task.state == TaskState.RUNNING:
        return messages.SUCCESS, _("Cancel requested: the task stops at its next step boundary.")
    if task.state == TaskState.COMPENSATING:
        return messages.SUCCESS, _("Task cancelled: its completed steps are being compensated.")
    states = {"before": TaskState(result.state_before).label, "after": TaskState(task.state).label}
    return messages.SUCCESS, _("Task cancelled: %(before)s → %(after)s.") % states


@admin.register(ApiClient)
class ApiClientAdmin(DenialsAuditedMixin, admin.ModelAdmin):
    """API clients: created with ``manage.py create_api_token``; revoked here or with ``revoke_api_token``.

    Revoking takes ``tasks.manage_apiclient`` (superusers only); each revoke and refusal is audited by the engine's
    signal (``dlq.client_audit``), each denial by ``DenialsAuditedMixin``.
    """

    list_display = ("name", "token_prefix", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name",)
    readonly_fields = (
        "name",
        "token_prefix",
        "created_at",
        "revoked_at",
        "signing_secret_hint",
    )
    # The callback signing secret is shown masked only (``manage.py callback_secret`` prints it).
    exclude = ("token_hash", "signing_secret", "previous_signing_secret", "previous_signing_secret_expires_at")
    actions = ("revoke",)

    @admin.display(description=_("secret"))
    def signing_secret_hint(self, obj: ApiClient) -> str:
        return secret_masked(obj.signing_secret) or "—"

    def lookup_allowed(self, lookup, value, request=None):
        # ?signing_secret__startswith=… would answer "is this the next character?" through the row count.
        if lookup.split("__", 1)[0] in ("signing_secret", "previous_signing_secret", "token_hash"):
            return False
        return super().lookup_allowed(lookup, value, request)

    # Revoking stops all of a client's traffic and callbacks: its own permission, held by no role (dlq.roles).
    @admin.action(description=_("Revoke the selected clients' tokens"), permissions=["manage"])
    def revoke(self, request, queryset):
        revoked, refused = 0, []
        actor, ip = operator_actor(request.user), client_ip(request)
        for name in queryset.values_list("name", flat=True):
            try:
                api_client_revoke(name=name, actor=actor, client_ip=ip)
            except ApiClientError as exc:  # revoked already (or meanwhile): audited by the engine's signal
                refused.append(refusal_detail(exc).sentence())
            else:
                revoked += 1
        if revoked:
            self.message_user(
                request,
                ngettext("Revoked %(n)d client.", "Revoked %(n)d clients.", revoked) % {"n": revoked},
                messages.SUCCESS,
            )
        if refused:
            self.message_user(request, _("Not done: %(why)s") % {"why": "; ".join(refused)}, messages.ERROR)

    def has_manage_permission(self, request) -> bool:
        return request.user.has_perm(MANAGE_PERMISSION)

    def denied_selection(self, request) -> str:
        # A refused revoke names the clients it aimed at: the entry then says whose traffic someone tried to stop.
        names = (
            ApiClient.objects.filter(pk__in=selected_row_ids(request)).order_by("name").values_list("name", flat=True)
        )
        return ",".join(names) or super().denied_selection(request)

    def has_add_permission(self, request) -> bool:
        return False  # tokens are shown once, by the command that creates them

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: tasks keep pointing at their client
