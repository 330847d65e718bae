"""The Schedules page: every schedule's next slot, pause, source and last runs with their tasks' states; the pages
that add, change, pause and resume one.

The page is read-only for every role (``tasks.view_pipelineschedule``). A supervisor also gets its actions, each
a page on GET that acts on POST through ``dlq.schedule_actions.schedule_act`` (one engine service, audited in its
transaction), then a message and a redirect (``dlq.admin.common.action_page``, the frame of every such page). A
POST without the permission is a 403 and an audit entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache

from dlq.admin.common import action_page, client_ip, deny
from dlq.audit_actions import SCHEDULE_ADDED, SCHEDULE_CHANGED
from dlq.schedule_actions import (
    ADD_PERMISSION,
    CHANGE_PERMISSION,
    SCHEDULE_ACTIONS,
    schedule_act,
    schedule_form_parse,
)
from tasks import registry
from tasks.models import PipelineSchedule, ScheduleRun, ScheduleSource, Task
from tasks.selectors import declared_schedules, schedule_of

# The last runs shown per schedule.
RUNS_SHOWN = 5
FORM_FIELDS = ("name", "pipeline", "cron", "every_seconds", "timezone", "input", "overlap", "catch_up_seconds")
FIELD_MAX_LENGTH = 10_000
DONE_MESSAGES = {
    "add": _("Schedule %(name)s added: its first slot is %(next)s."),
    "change": _("Schedule %(name)s changed: its next slot is %(next)s."),
    "pause": _("Schedule %(name)s paused: none of its slots fires until it is resumed."),
    "resume": _("Schedule %(name)s resumed: its next slot is %(next)s."),
}


@dataclass(frozen=True)
class RunRow:
    run: ScheduleRun
    task: Task | None


@dataclass(frozen=True)
class ScheduleRow:
    schedule: PipelineSchedule
    definition: str
    declared: bool  # a code schedule still declared (False: its code no longer has it)
    runs: list[RunRow]
    actions: list[tuple[str, str, str]]  # (name, label, page URL)


def _rows(user) -> list[ScheduleRow]:
    schedules = list(PipelineSchedule.objects.all())
    runs: dict[int, list[ScheduleRun]] = {}
    for schedule in schedules:
        runs[schedule.pk] = list(ScheduleRun.objects.filter(schedule=schedule).order_by("-slot_at")[:RUNS_SHOWN])
    task_ids = {run.task_id for rows in runs.values() for run in rows if run.task_id}
    tasks = {task.pk: task for task in Task.objects.filter(pk__in=task_ids).only("pk", "state", "pipeline")}
    declared = declared_schedules()
    return [
        ScheduleRow(
            schedule=schedule,
            definition=_definition(schedule),
            declared=schedule.source == ScheduleSource.CONSOLE or schedule.name in declared,
            runs=[RunRow(run=run, task=tasks.get(run.task_id)) for run in runs[schedule.pk]],
            actions=_actions(schedule, user),
        )
        for schedule in schedules
    ]


def _definition(schedule: PipelineSchedule) -> str:
    try:
        return schedule_of(schedule).describe()
    except Exception:  # a row another release wrote: shown as stored
        return schedule.cron or f"{schedule.every_seconds} s"


def _actions(schedule: PipelineSchedule, user) -> list[tuple[str, str, str]]:
    actions = [
        (name, str(spec.label), reverse("schedule_act", args=[schedule.pk, name]))
        for name, spec in SCHEDULE_ACTIONS.items()
        if user.has_perm(spec.permission) and (schedule.paused == (name == "resume"))
    ]
    if schedule.source == ScheduleSource.CONSOLE and user.has_perm(CHANGE_PERMISSION):
        actions.append(("change", str(_("Change")), reverse("schedule_change", args=[schedule.pk])))
    return actions


@staff_member_required
@permission_required("tasks.view_pipelineschedule", raise_exception=True)
@never_cache
def schedules(request: HttpRequest) -> HttpResponse:
    """Every schedule: definition, source, paused, next slot, skipped and missed slots, last runs and their tasks."""
    context = {
        **admin.site.each_context(request),
        "title": _("Schedules"),
        "rows": _rows(request.user),
        "can_add": request.user.has_perm(ADD_PERMISSION),
    }
    return TemplateResponse(request, "admin/schedules.html", context)


@staff_member_required
@never_cache
def schedule_action_page(request: HttpRequest, schedule_id: int, action: str) -> HttpResponse:
    """GET: what pausing or resuming does, and the reason's form. POST: act, message, redirect."""
    spec = SCHEDULE_ACTIONS.get(action)
    if spec is None:
        raise Http404("unknown action")
    schedule = get_object_or_404(PipelineSchedule, pk=schedule_id)
    if not request.user.has_perm(spec.permission):
        deny(request, action=spec.audit_action, target_type="schedule", target_id=schedule.name)
    return action_page(
        request,
        lambda: _act(request, action, schedule),
        template="admin/schedule_confirm.html",
        title=_("%(action)s: schedule %(name)s") % {"action": spec.label, "name": schedule.name},
        page_context=lambda: {"spec": spec, "schedule": schedule, "definition": _definition(schedule)},
        done_url=_done_url,
        done_message=lambda done: _done_message(action, done),
        return_url=reverse("schedules"),
    )


@staff_member_required
@never_cache
def schedule_edit_page(request: HttpRequest, schedule_id: int | None = None) -> HttpResponse:
    """GET: the form of a new console schedule, or of one to change. POST: add or change it, message, redirect."""
    schedule = get_object_or_404(PipelineSchedule, pk=schedule_id) if schedule_id is not None else None
    action = "add" if schedule is None else "change"
    permission, audit_action = (
        (ADD_PERMISSION, SCHEDULE_ADDED) if schedule is None else (CHANGE_PERMISSION, SCHEDULE_CHANGED)
    )
    if not request.user.has_perm(permission):
        target = schedule.name if schedule is not None else request.POST.get("name", "")[:150]
        deny(request, action=audit_action, target_type="schedule", target_id=target)
    if schedule is not None and schedule.source == ScheduleSource.CODE:
        raise Http404("a schedule declared in code is changed in its code")
    form = {field: request.POST.get(field, "")[:FIELD_MAX_LENGTH] for field in FORM_FIELDS}
    if request.method != "POST" and schedule is not None:
        form = _form_of(schedule)
    return action_page(
        request,
        lambda: _act(request, action, schedule, form=form),
        template="admin/schedule_form.html",
        title=_("Add schedule") if schedule is None else _("Change schedule %(name)s") % {"name": schedule.name},
        page_context=lambda: {"schedule": schedule, "form": form, "pipelines": registry.names()},
        done_url=_done_url,
        done_message=lambda done: _done_message(action, done),
        return_url=reverse("schedules"),
        refusal_on_form=True,  # what was typed stays, with the refusal on it
    )


def _form_of(schedule: PipelineSchedule) -> dict[str, str]:
    return {
        "name": schedule.name,
        "pipeline": schedule.pipeline,
        "cron": schedule.cron,
        "every_seconds": f"{schedule.every_seconds:g}" if schedule.every_seconds is not None else "",
        "timezone": schedule.timezone,
        "input": json.dumps(schedule.input if schedule.input is not None else {}, ensure_ascii=False),
        "overlap": schedule.overlap,
        "catch_up_seconds": f"{schedule.catch_up_seconds:g}" if schedule.catch_up_seconds is not None else "",
    }


def _act(request: HttpRequest, action: str, schedule: PipelineSchedule | None, *, form: dict | None = None):
    parsed = None
    if form is not None:
        parsed = schedule_form_parse(
            pipeline=form["pipeline"],
            cron=form["cron"],
            every_seconds=form["every_seconds"],
            timezone_name=form["timezone"],
            input_json=form["input"],
            overlap=form["overlap"],
            catch_up=form["catch_up_seconds"],
        )
    return schedule_act(
        schedule=schedule,
        action=action,
        actor=request.user,
        reason=request.POST.get("reason", ""),
        form=parsed,
        name=(form or {}).get("name", ""),
        client_ip=client_ip(request),
    )


def _done_url(done: PipelineSchedule) -> str:
    return f"{reverse('schedules')}#schedule-{done.pk}"


def _done_message(action: str, done: PipelineSchedule) -> str:
    next_slot = f"{done.next_slot_at:%Y-%m-%d %H:%M:%S} UTC" if done.next_slot_at else "-"
    return DONE_MESSAGES[action] % {"name": done.name, "next": next_slot}
