"""Operator actions on live work: cancel a task; pause, resume and limit a pipeline.

Each checks the actor's permission, checks the form, and calls one engine
service (``tasks.lifecycle.cancellation.task_cancel``, ``tasks.lifecycle.controls``),
which makes the change in one transaction and sends its signal there: the
success's audit entry is written by ``dlq.control_audit`` in that
transaction, so an API client's cancel is audited the same way. What the
console refuses (a denied permission, a task that cannot be cancelled, a
repeated cancel, a change the engine refuses) it audits here, as
``dlq.actions`` does for dead letters. A bad form (no reason, a limit that is
not one) is a form error that writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.actions import MAX_REASON_LENGTH, ActionDenied, ActionRefused, ReasonRequired
from dlq.audit import audit_denied, audit_record
from dlq.audit_actions import (
    PIPELINE_LIMITS_RESET,
    PIPELINE_LIMITS_SET,
    PIPELINE_PAUSED,
    PIPELINE_RESUMED,
    TASK_CANCELLED,
)
from dlq.audit_details import CANCEL_REPEATED, AuditDetail, refusal_detail
from dlq.models import AuditOutcome
from tasks.exceptions import (
    ConfigurationError,
    PipelineControlRefused,
    ReliabilityError,
    TaskNotActionable,
    TaskNotCancellable,
)
from tasks.lifecycle import (
    UNCHANGED,
    CancelResult,
    pipeline_limits_reset,
    pipeline_limits_set,
    pipeline_pause,
    pipeline_resume,
    task_cancel,
)
from tasks.models import CANCELLABLE_STATES, PipelineControl, Task
from tasks.pipelines.limits import MAX_LIMIT, RateLimit, concurrency_check
from tasks.selectors import PipelineState

T = TypeVar("T")

CANCEL_PERMISSION = "dlq.cancel_task"
PAUSE_PERMISSION = "tasks.pause_pipeline"
LIMIT_PERMISSION = "tasks.limit_pipeline"


class FormInvalid(ReasonRequired):
    """A field of the form is not valid (a limit that is not one): shown on the form, nothing written."""

    code = "form_invalid"


def operator_actor(user) -> str:
    """Who the engine records as having acted, for a console user (``operator:alice``)."""
    return f"operator:{user.get_username()}"


def reason_checked(reason: str) -> str:
    """The reason, stripped; a ``ReasonRequired`` when it is missing or too long (nothing is written)."""
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired(gettext("give a reason: it goes into the audit log"))
    if len(reason) > MAX_REASON_LENGTH:
        raise ReasonRequired(gettext("the reason must be at most %(n)d characters") % {"n": MAX_REASON_LENGTH})
    return reason


def operator_permitted(actor, *, permission: str, label: Any, reason: str, target: dict) -> str:
    """The checked reason of an action ``actor`` (a user) may take. Without ``permission``: the denial audited
    (``target``: the entry's action, target and address) and ``ActionDenied``; without a reason (or too long a
    one): ``ReasonRequired``, nothing written."""
    if not actor.has_perm(permission):
        audit_denied(actor=actor.get_username(), reason=reason, **target)
        raise ActionDenied(gettext("you may not do this: %(action)s") % {"action": label})
    return reason_checked(reason)


def engine_act(
    actor,
    *,
    permission: str,
    label: Any,
    reason: str,
    target: dict,
    refusals: type[ReliabilityError],
    act: Callable[[str], T],
    refused_message: Any = None,
) -> T:
    """``act(reason)``, the one engine service an operator's action is, for ``actor`` once ``operator_permitted``;
    a refusal of the engine's (``refusals``) audited and an ``ActionRefused`` in the reader's language
    (``refused_message``, or the refusal's own words). A success is audited by the engine's signal, in its
    transaction."""
    reason = operator_permitted(actor, permission=permission, label=label, reason=reason, target=target)
    try:
        return act(reason)
    except refusals as exc:
        detail = refusal_detail(exc)
        refusal_audited(actor.get_username(), reason, detail, **target)
        raise ActionRefused(str(refused_message or detail.sentence()), code=exc.code, details=exc.details) from None


# --- cancel ------------------------------------------------------------------------------


def task_cancellable(task: Task) -> bool:
    """Whether the console offers to cancel ``task`` (the engine checks again under the row lock)."""
    return task.state in CANCELLABLE_STATES and not task.is_cancelled


def task_cancel_by_operator(*, task_id, actor, reason: str, client_ip: str | None = None) -> CancelResult:
    """Cancel ``task_id`` for ``actor`` (a user), checking ``dlq.cancel_task``; refusals and denials audited.

    A repeat of an accepted cancel is refused (its first request stands, and
    its entry is the only success); a finished task is refused with its state.
    """
    name = actor.get_username()
    target = {"action": TASK_CANCELLED, "target_type": "task", "target_id": str(task_id), "client_ip": client_ip}
    reason = operator_permitted(
        actor, permission=CANCEL_PERMISSION, label=gettext("Cancel task"), reason=reason, target=target
    )
    try:
        result = task_cancel(task_id=task_id, actor=operator_actor(actor), reason=reason, client_ip=client_ip)
    except TaskNotCancellable as exc:
        detail = refusal_detail(exc)
        refusal_audited(name, reason, detail, state=exc.state, **target)
        raise ActionRefused(detail.sentence()) from None
    except TaskNotActionable as exc:
        refusal_audited(name, reason, refusal_detail(exc), **target)
        raise ActionRefused(gettext("this task no longer exists")) from None
    if not result.requested_now:
        task = result.task
        refusal_audited(name, reason, AuditDetail(CANCEL_REPEATED), state=task.state, **target)
        raise ActionRefused(
            gettext("a cancel of this task was already requested by %(who)s at %(when)s")
            % {
                "who": task.cancel_requested_by,
                "when": f"{timezone.localtime(task.cancel_requested_at):%Y-%m-%d %H:%M:%S}",
            }
        )
    return result


def refusal_audited(actor: str, reason: str, detail: AuditDetail, *, state: str = "", **target) -> None:
    """The audit entry of an action the engine refused (the console's live actions and schedules)."""
    audit_record(
        actor=actor,
        reason=reason,
        detail=detail,
        outcome=AuditOutcome.REFUSED,
        task_id=target["target_id"] if target["target_type"] == "task" else None,
        state_before=state,
        state_after=state,
        **target,
    )


# --- pipelines ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorAction:
    """One of the console's own actions on a page of its own (a pipeline's, a schedule's)."""

    name: str  # in the URL: /admin/pipelines/<pipeline>/act/<name>/, /admin/schedules/<id>/act/<name>/
    audit_action: str  # the audit entry's action (dlq.control_audit)
    label: Any
    permission: str
    help: Any
    # What the console says when the engine refuses it (its state changed since the page was shown); None: the
    # engine's own words (a limit it refused).
    refused: Any = None


@dataclass(frozen=True)
class PipelineAction(OperatorAction):
    def allows(self, state: PipelineState) -> bool:
        """Whether the pipeline's state lets this action run now (the engine checks again)."""
        paused = bool(state.control and state.control.paused)
        if self.name == "pause":
            return not paused
        if self.name == "resume":
            return paused
        if self.name == "reset_limits":
            return state.limits_overridden
        return True


PIPELINE_ACTIONS: dict[str, PipelineAction] = {
    action.name: action
    for action in (
        PipelineAction(
            "pause",
            PIPELINE_PAUSED,
            _("Pause"),
            PAUSE_PERMISSION,
            _(
                "No step of this pipeline starts until it is resumed: running steps finish and their tasks wait at "
                "the next step boundary, without using an attempt. Submissions are still accepted and wait too; "
                "deadlines keep running."
            ),
            _("the pipeline is already paused"),
        ),
        PipelineAction(
            "resume",
            PIPELINE_RESUMED,
            _("Resume"),
            PAUSE_PERMISSION,
            _("The tasks held by the pause start again, oldest first, as far as the pipeline's limits allow."),
            _("the pipeline is not paused"),
        ),
        PipelineAction(
            "set_limits",
            PIPELINE_LIMITS_SET,
            _("Set limits"),
            LIMIT_PERMISSION,
            _(
                "The new limits override the ones the pipeline's code declares, on every worker, until they are "
                "reset. Tasks that cannot start wait without using an attempt."
            ),
        ),
        PipelineAction(
            "reset_limits",
            PIPELINE_LIMITS_RESET,
            _("Reset limits"),
            LIMIT_PERMISSION,
            _("The pipeline goes back to the limits its code declares."),
            _("the pipeline already runs with the limits its code declares"),
        ),
    )
}


@dataclass(frozen=True)
class LimitsForm:
    """A limits change as the form gives it: ``UNCHANGED`` keeps a limit, ``None`` removes it."""

    max_concurrency: Any = UNCHANGED
    rate_limit: Any = UNCHANGED


def limits_form_parse(
    *, max_concurrency: str, no_concurrency_limit: bool, rate_limit: str, no_rate_limit: bool
) -> LimitsForm:
    """The limits a form asks for: a blank field keeps its limit, "no limit" removes it; a bad value is
    ``FormInvalid``."""
    max_concurrency, rate_limit = (max_concurrency or "").strip(), (rate_limit or "").strip()
    if (no_concurrency_limit and max_concurrency) or (no_rate_limit and rate_limit):
        raise FormInvalid(gettext('give a limit or choose "no limit", not both'))
    concurrency: Any = None if no_concurrency_limit else UNCHANGED
    if max_concurrency:
        try:
            concurrency = concurrency_check(int(max_concurrency))
        except (ValueError, ConfigurationError):
            raise FormInvalid(
                gettext("the max concurrency must be a whole number from 1 to %(max)d") % {"max": MAX_LIMIT}
            ) from None
    rate: Any = None if no_rate_limit else UNCHANGED
    if rate_limit:
        try:
            rate = str(RateLimit.parse(rate_limit))
        except ConfigurationError:
            raise FormInvalid(
                gettext(
                    'the rate limit must be a whole number from 1 to %(max)d per second, minute or hour, like "10/s",'
                    ' "600/m" or "3600/h"'
                )
                % {"max": MAX_LIMIT}
            ) from None
    if concurrency is UNCHANGED and rate is UNCHANGED:
        raise FormInvalid(gettext("give a new limit (or choose no limit) for the concurrency, the rate or both"))
    return LimitsForm(max_concurrency=concurrency, rate_limit=rate)


def pipeline_act(
    *,
    pipeline: str,
    action: str,
    actor,
    reason: str,
    limits: LimitsForm | None = None,
    client_ip: str | None = None,
) -> PipelineControl:
    """Pause, resume, set or reset the limits of ``pipeline`` for ``actor`` (a user), checking the permission;
    refusals and denials audited (a success is audited by the engine's signal, in its transaction)."""
    spec = PIPELINE_ACTIONS.get(action)
    if spec is None:
        raise ActionRefused(f"unknown action {action!r}")
    target = {"action": spec.audit_action, "target_type": "pipeline", "target_id": pipeline, "client_ip": client_ip}

    def act(reason: str) -> PipelineControl:
        engine = {"pipeline": pipeline, "actor": operator_actor(actor), "reason": reason, "client_ip": client_ip}
        if action == "pause":
            return pipeline_pause(**engine)
        if action == "resume":
            return pipeline_resume(**engine)
        if action == "set_limits":
            if limits is None:
                raise FormInvalid(
                    gettext("give a new limit (or choose no limit) for the concurrency, the rate or both")
                )
            return pipeline_limits_set(**engine, max_concurrency=limits.max_concurrency, rate_limit=limits.rate_limit)
        return pipeline_limits_reset(**engine)

    return engine_act(
        actor,
        permission=spec.permission,
        label=spec.label,
        reason=reason,
        target=target,
        refusals=PipelineControlRefused,
        act=act,
        refused_message=spec.refused,
    )
