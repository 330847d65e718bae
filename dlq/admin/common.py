"""What the console's admin views share: the operator's form, turning a service's answer into a response, and
auditing a POST to a model page the user may not write to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from dlq.actions import MAX_REASON_LENGTH, ActionDenied, ActionRefused, ReasonRequired
from dlq.audit import audit_denied
from dlq.audit_actions import action_label
from dlq.audit_details import detail_text
from dlq.bulk import BulkRefused
from dlq.models import AuditEntry


class ActionFilter(admin.SimpleListFilter):
    """Filter by the action taken, offered by name in the reader's language (Django's would list the codes)."""

    title = _("action")
    parameter_name = "action"

    def lookups(self, request, model_admin):
        # The same SELECT DISTINCT as Django's own filter on the column.
        codes = model_admin.model.objects.order_by("action").values_list("action", flat=True).distinct()
        return [(code, action_label(code)) for code in codes]

    def queryset(self, request, queryset):
        return queryset.filter(action=self.value()) if self.value() else queryset


# What an audit entry's target is, by name in the reader's language; other targets (model names) keep their code.
TARGET_LABELS = {
    "task": _("task"),
    "pipeline": _("pipeline"),
    "dlq_item": _("dead-letter item"),
    "bulk_operation": _("bulk action"),
    "audit_log": _("audit log"),
    "alert_rule": _("alert rule"),
    "alert_channel": _("alert channel"),
    "apiclient": _("API client"),
}


def target_label(target_type: str) -> str:
    return str(TARGET_LABELS.get(target_type, target_type))


class TargetTypeFilter(admin.SimpleListFilter):
    """Filter by the kind of target, offered by name in the reader's language."""

    title = _("target type")
    parameter_name = "target_type"

    def lookups(self, request, model_admin):
        codes = model_admin.model.objects.order_by("target_type").values_list("target_type", flat=True).distinct()
        return [(code, target_label(code)) for code in codes]

    def queryset(self, request, queryset):
        return queryset.filter(target_type=self.value()) if self.value() else queryset


def detail_label(entry: AuditEntry, *, stored: str | None = None) -> str:
    """An audit entry's detail in the reader's language: its code worded with its parameters, else (an entry
    written before the codes) its stored ``detail``, a fixed phrase translated.

    ``stored``: the stored text when the page read only its start (``Left``), instead of ``entry.detail``.
    """
    return detail_text(
        code=entry.detail_code, params=entry.detail_params, stored=entry.detail if stored is None else stored
    )


def client_ip(request: HttpRequest) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


# A refused list action's entry names at most this many of the rows it aimed at (the POST may be forged).
MAX_DENIED_ROWS = 20
# Longer "ids" would overflow a bigint lookup: no row has one.
MAX_ROW_ID_DIGITS = 18


def selected_row_ids(request: HttpRequest) -> list[int]:
    """The first ``MAX_DENIED_ROWS`` ids a list action's POST selected, leaving out anything that is not an id."""
    values = request.POST.getlist(ACTION_CHECKBOX_NAME)[:MAX_DENIED_ROWS]
    return [int(value) for value in values if value.isascii() and value.isdigit() and len(value) <= MAX_ROW_ID_DIGITS]


def operator_form(request: HttpRequest) -> dict[str, Any]:
    """What every operator action takes from a POST: the reason, the resolution code, where it came from."""
    return {
        "reason": request.POST.get("reason", ""),
        "resolution_code": request.POST.get("resolution_code", ""),
        "client_ip": client_ip(request),
    }


def deny(request: HttpRequest, *, action: str, target_type: str, target_id) -> None:
    """Refuse a page the user lacks the permission for; an attempt to act (POST) is audited."""
    if request.method == "POST":
        audit_denied(
            actor=request.user.get_username(),
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            client_ip=client_ip(request),
            reason=request.POST.get("reason", ""),
        )
    raise PermissionDenied


def posted(
    request: HttpRequest,
    call: Callable[[], Any],
    *,
    done_url: str | Callable[[Any], str],
    done_message: Callable[[Any], tuple[int, str]],
    refused_url: str | None = None,
) -> HttpResponse | str:
    """The response to an action's POST, or the text of a form problem (the caller shows the form again with it).

    ``call`` runs the one service the action is. A missing permission is a 403. A missing reason or a bad field is
    the form's problem. A refusal (someone acted first, a wrong state) is a message and a redirect to
    ``refused_url``; without one it is shown on the form like a missing reason. Done: ``done_message(result)``
    (its level and text) and a redirect to ``done_url``.
    """
    try:
        result = call()
    except ActionDenied:
        raise PermissionDenied from None
    except ReasonRequired as exc:
        return exc.message
    except (ActionRefused, BulkRefused) as exc:
        if refused_url is None:
            return exc.message
        messages.error(request, _("Not done: %(why)s") % {"why": exc.message})
        return HttpResponseRedirect(refused_url)
    level, text = done_message(result)
    messages.add_message(request, level, text)
    return HttpResponseRedirect(done_url(result) if callable(done_url) else done_url)


def action_page(
    request: HttpRequest,
    call: Callable[[], Any],
    *,
    template: str,
    title: Any,
    page_context: Callable[[], dict[str, Any]],
    done_url: str | Callable[[Any], str],
    done_message: Callable[[Any], str],
    return_url: str,
    refusal_on_form: bool = False,
) -> HttpResponse:
    """The frame of the console's own action pages (a pipeline's, a schedule's, an approval's): GET shows
    ``template``, what the action does and its form; POST acts through ``posted`` (a message and a redirect), or
    shows the page again with the form's problem (400). ``return_url``: where Cancel leads, and a refusal (unless
    ``refusal_on_form``: a form the reader fills in again keeps what was typed, with the refusal on it)."""
    error = ""
    if request.method == "POST":
        answer = posted(
            request,
            call,
            done_url=done_url,
            done_message=lambda result: (messages.SUCCESS, done_message(result)),
            refused_url=None if refusal_on_form else return_url,
        )
        if isinstance(answer, HttpResponse):
            return answer
        error = answer
    context = {
        **admin.site.each_context(request),
        "title": title,
        **page_context(),
        "error": error,
        # Shown again after a form error: never more than may be stored.
        "reason": request.POST.get("reason", "")[:MAX_REASON_LENGTH],
        "cancel_url": return_url,
    }
    return TemplateResponse(request, template, context, status=400 if error else 200)


class ServiceViewMixin:
    """For ModelAdmins whose views call one service on POST and answer with a message and a redirect."""

    perform = staticmethod(posted)  # ``self.perform(request, call, done_url=..., ...)`` in a ModelAdmin's view


class DenialsAuditedMixin:
    """A POST to a model's pages that the user lacks the permission for is refused (403) and audited.

    Operator actions audit their own denials (``dlq.actions``, ``dlq.bulk``);
    this covers Django's add, change and delete pages and the list's actions,
    so every refused attempt to write through the console leaves a trace.
    """

    # The entries' target type: the model's name, unless its admin names it as its own entries do (alert_rule).
    audit_target_type = ""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        with _denial_audited(request, self, "add" if object_id is None else "change", object_id or "new"):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        with _denial_audited(request, self, "delete", object_id):
            return super().delete_view(request, object_id, extra_context)

    def changelist_view(self, request, extra_context=None):
        action = request.POST.get("action", "") if request.method == "POST" else ""
        with _denial_audited(request, self, action or "list", lambda: self.denied_selection(request)):
            if action and action not in self.get_actions(request):
                # Django would answer "no action selected"; it is an attempt the user had no permission for.
                raise PermissionDenied
            return super().changelist_view(request, extra_context)

    def denied_selection(self, request: HttpRequest) -> str:
        """The target a refused list action's entry names: "selected" (a model's admin may name the rows)."""
        return "selected"


@contextmanager
def _denial_audited(request: HttpRequest, model_admin, verb: str, target_id: str | Callable[[], str]) -> Iterator[None]:
    try:
        yield
    except PermissionDenied:
        if request.method == "POST" and request.user.is_authenticated:
            audit_denied(
                actor=request.user.get_username(),
                action=f"{verb}_{model_admin.opts.model_name}",
                target_type=model_admin.audit_target_type or model_admin.opts.model_name,
                target_id=str(target_id() if callable(target_id) else target_id),
                client_ip=client_ip(request),
                reason=request.POST.get("reason", ""),
            )
        raise
