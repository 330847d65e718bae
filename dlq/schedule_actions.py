"""Supervisors' actions on schedules: add, change, pause, resume.

Each checks the actor's permission, checks the form, and calls one engine service
(``tasks.lifecycle.schedules``), which makes the change in one transaction and sends ``schedule_changed`` there:
the success's audit entry is written by ``dlq.control_audit`` in that transaction. What the console refuses (a
denied permission, a change the engine refuses) it audits here. A bad form (no reason, input that is not JSON) is
a form error that writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.actions import ActionRefused
from dlq.audit_actions import SCHEDULE_ADDED, SCHEDULE_CHANGED, SCHEDULE_PAUSED, SCHEDULE_RESUMED
from dlq.live_actions import FormInvalid, OperatorAction, engine_act, operator_actor
from tasks.exceptions import ScheduleRefused
from tasks.lifecycle import schedule_add, schedule_change, schedule_pause, schedule_resume
from tasks.models import PipelineSchedule

ADD_PERMISSION = "tasks.add_pipelineschedule"
CHANGE_PERMISSION = "tasks.change_pipelineschedule"
PAUSE_PERMISSION = "tasks.pause_pipelineschedule"


# A schedule's actions are the console's own kind (``dlq.live_actions.OperatorAction``).
ScheduleAction = OperatorAction


SCHEDULE_ACTIONS: dict[str, ScheduleAction] = {
    action.name: action
    for action in (
        ScheduleAction(
            "pause",
            SCHEDULE_PAUSED,
            _("Pause"),
            PAUSE_PERMISSION,
            _("None of this schedule's slots fires until it is resumed; the slots of the pause are not caught up."),
        ),
        ScheduleAction(
            "resume",
            SCHEDULE_RESUMED,
            _("Resume"),
            PAUSE_PERMISSION,
            _("The schedule fires again from its first slot after now."),
        ),
    )
}


@dataclass(frozen=True)
class ScheduleForm:
    """A console schedule's definition as the form gives it, checked for shape (the engine checks the rest)."""

    pipeline: str
    cron: str | None
    every: timedelta | None
    timezone_name: str
    input: Any
    overlap: str
    catch_up_window: timedelta | None

    def as_kwargs(self) -> dict[str, Any]:
        return dict(self.__dict__)


def schedule_form_parse(
    *, pipeline: str, cron: str, every_seconds: str, timezone_name: str, input_json: str, overlap: str, catch_up: str
) -> ScheduleForm:
    """The definition a form asks for; a field that is not one is ``FormInvalid``."""
    cron, every_seconds, catch_up = (cron or "").strip(), (every_seconds or "").strip(), (catch_up or "").strip()
    if bool(cron) == bool(every_seconds):
        raise FormInvalid(gettext("give a cron expression or an interval in seconds, not both or neither"))
    every = window = None
    try:
        if every_seconds:
            every = timedelta(seconds=float(every_seconds))
        if catch_up:
            window = timedelta(seconds=float(catch_up))
    except (ValueError, OverflowError):
        raise FormInvalid(gettext("the interval and the catch-up window are numbers of seconds")) from None
    try:
        data = json.loads(input_json) if (input_json or "").strip() else {}
    except ValueError:
        raise FormInvalid(gettext("the input must be JSON")) from None
    return ScheduleForm(
        pipeline=(pipeline or "").strip(),
        cron=cron or None,
        every=every,
        timezone_name=(timezone_name or "").strip() or "UTC",
        input=data,
        overlap=(overlap or "skip").strip(),
        catch_up_window=window,
    )


def schedule_act(
    *,
    schedule: PipelineSchedule | None,
    action: str,
    actor,
    reason: str,
    form: ScheduleForm | None = None,
    name: str = "",
    client_ip: str | None = None,
) -> PipelineSchedule:
    """Add (``schedule`` None), change, pause or resume a schedule for ``actor`` (a user), checking the permission;
    refusals and denials audited (a success is audited by the engine's signal, in its transaction)."""
    if action == "add":
        audit_action, permission, label = SCHEDULE_ADDED, ADD_PERMISSION, _("Add schedule")
    elif action == "change":
        audit_action, permission, label = SCHEDULE_CHANGED, CHANGE_PERMISSION, _("Change schedule")
    elif action in SCHEDULE_ACTIONS:
        spec = SCHEDULE_ACTIONS[action]
        audit_action, permission, label = spec.audit_action, spec.permission, spec.label
    else:
        raise ActionRefused(f"unknown action {action!r}")
    target_id = schedule.name if schedule is not None else name
    target = {"action": audit_action, "target_type": "schedule", "target_id": target_id, "client_ip": client_ip}

    def act(reason: str) -> PipelineSchedule:
        engine = {"actor": operator_actor(actor), "reason": reason, "client_ip": client_ip}
        if action == "add":
            return schedule_add(name=name.strip(), **form.as_kwargs(), **engine)
        if action == "change":
            return schedule_change(schedule_id=schedule.pk, **form.as_kwargs(), **engine)
        if action == "pause":
            return schedule_pause(schedule_id=schedule.pk, **engine)
        return schedule_resume(schedule_id=schedule.pk, **engine)

    return engine_act(
        actor, permission=permission, label=label, reason=reason, target=target, refusals=ScheduleRefused, act=act
    )
