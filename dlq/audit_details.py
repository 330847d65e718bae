"""What an audit entry's detail says, in the reader's language.

An entry stores its detail as a code (``AuditEntry.detail_code``) and the
facts its sentence needs (``detail_params``: a state, a count, a pipeline),
and pages make the sentence when they show it, so the refusal an operator met
in English reads in Chinese for the next reader. A refusal's code is the
console's own (``item_resolved``) or the engine's (``TaskNotActionable.code``,
``PipelineControlRefused.code``, with their ``details`` as parameters).

The English sentence is stored too (``detail``), for the readers that only
know that column: a previous release after a rollback, exports, SQL by hand.
A close's resolution and a limits change keep the form earlier releases gave
them there (the resolution code, the limits as compact JSON), which those
releases word themselves. Entries written before the codes existed have no
code and are shown from ``detail``: its fixed phrases translated, anything
else as stored; so is a code this release cannot word (an engine's refusal
newer than the console), from its English sentence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.utils import translation
from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from dlq.audit_actions import action_label
from dlq.models import BulkStatus
from tasks.exceptions import ReliabilityError
from tasks.models import ResolutionCode, TaskState, resolution_label

# Details the console writes.
RESOLUTION = "resolution"  # a close's resolution code
PERMISSION_DENIED = "permission_denied"
CANCEL_AT_BOUNDARY = "cancel_at_boundary"  # a running task stops at its next step boundary
CANCEL_REPEATED = "cancel_repeated"
LIMITS_CHANGED = "limits_changed"  # a pipeline's limits before and after
BULK_ITEMS = "bulk_items"  # a bulk action's action and item count
BULK_SELF_APPROVAL = "bulk_self_approval"
CANARY_FAILED = "canary_failed"
AUDIT_PURGED = "audit_purged"
# The console's own refusals of a dead-letter action (dlq.actions).
ITEM_GONE = "item_gone"
ITEM_RESOLVED = "item_resolved"
ITEM_STATE_CHANGED = "item_state_changed"
# Changes to alert rules and channels (dlq.alerting.config_changes), worded by dlq.alerting.change_texts.
FIELDS_CHANGED = "fields_changed"  # the fields before and after; a credential only as changed
TEST_DELIVERED = "test_delivered"
TEST_NOT_DELIVERED = "test_not_delivered"  # the send path's error code and its message, without URL or secret
CHANNEL_URL_REFUSED = "channel_url_refused"  # a channel not switched on: its URL may not be sent to
ALERT_CONFIG_DETAILS = (FIELDS_CHANGED, TEST_NOT_DELIVERED, CHANNEL_URL_REFUSED)
APPROVAL_DECIDED = "approval_decided"  # the approval wait a decision was sent to
APPROVAL_NOT_WAITING = "approval_not_waiting"  # the task left the wait (decided, cancelled, timed out)

DETAIL_MESSAGES = {
    PERMISSION_DENIED: _("permission denied"),
    CANCEL_AT_BOUNDARY: _("stops at its next step boundary"),
    CANCEL_REPEATED: _("a cancel was already requested"),
    BULK_ITEMS: ngettext_lazy("%(action)s on %(total)s item", "%(action)s on %(total)s items", "total"),
    BULK_SELF_APPROVAL: _("the requester cannot approve their own bulk action"),
    CANARY_FAILED: ngettext_lazy(
        "%(failed)s of %(canary)s canary item failed", "%(failed)s of %(canary)s canary items failed", "canary"
    ),
    AUDIT_PURGED: ngettext_lazy(
        "%(count)s entry created before %(cutoff)s deleted (older than %(days)s days)",
        "%(count)s entries created before %(cutoff)s deleted (older than %(days)s days)",
        "count",
    ),
    ITEM_GONE: _("this dead letter no longer exists"),
    ITEM_RESOLVED: _("this dead letter was already resolved"),
    ITEM_STATE_CHANGED: _("not possible while the task is %(state)s: someone may have acted first"),
    TEST_DELIVERED: _("test notification delivered"),
    # The engine's refusals (tasks.lifecycle.operator and .cancellation, tasks.lifecycle.controls), by their codes.
    "retry_not_failed": _("the task is %(state)s: only failed tasks can be retried from checkpoint"),
    "retry_cancelled": _("the task was cancelled: compensate it or close its dead letter"),
    "retry_from_start_not_allowed": _(
        "the task is %(state)s: only compensated tasks, or tasks parked because their pipeline changed, can be "
        "retried from start"
    ),
    "compensate_not_failed": _("the task is %(state)s: only failed tasks can be compensated"),
    "close_not_failed": _("the task is %(state)s: only failed tasks can be closed"),
    "no_open_dead_letter": _("the task has no open dead letter"),
    "no_such_task": _("no such task"),
    "task_changed": _("the task changed while acting on it; reload and try again"),
    "task_not_cancellable": _("the task is %(state)s: there is nothing left to cancel"),
    "already_paused": _("pipeline %(pipeline)s is already paused (by %(paused_by)s)"),
    "not_paused": _("pipeline %(pipeline)s is not paused"),
    "limits_declared_already": _("pipeline %(pipeline)s already runs with the limits its code declares"),
    "unknown_pipeline": _("no pipeline %(pipeline)s is registered"),
    "limit_invalid": _("the limit is not valid: %(error)s"),
    "no_limit_given": _("give a new limit (or choose no limit) for the concurrency, the rate or both"),
    "reason_required": _("give a reason: it goes into the audit log"),
    "reason_too_long": _("a reason is at most %(max)s characters"),
    # tasks.lifecycle.clients' refusals.
    "client_name_invalid": _("a client name is 1 to %(max)s characters"),
    "client_exists": _("a client named %(client)s already exists"),
    "no_such_client": _("no client named %(client)s"),
    "client_already_revoked": _("client %(client)s was revoked already"),
    # The approval inbox (dlq.approvals): the wait decided at; a task no longer waiting there; the engine's
    # refusals of the signal (tasks.lifecycle.signals).
    APPROVAL_DECIDED: _("decided at the wait %(wait)s"),
    APPROVAL_NOT_WAITING: _(
        "the task is no longer waiting for this approval (it is %(state)s): someone decided first, or it was "
        "cancelled or timed out"
    ),
    "signal_already_received": _("the task already received the signal %(name)s, with another payload"),
    "task_finished": _("the task is %(state)s: no wait of it will come"),
    "unknown_signal": _("pipeline %(pipeline)s waits for no signal %(name)s"),
}
# Parameters that hold a code of their own, shown by its name in the reader's language.
CODED_PARAMS = ("state", "action", "resolution")
# What entries written before the codes stored in ``detail`` as a fixed phrase (or a resolution code).
STORED_PHRASES = {
    **dict(ResolutionCode.choices),
    "permission denied": DETAIL_MESSAGES[PERMISSION_DENIED],
    "stops at its next step boundary": DETAIL_MESSAGES[CANCEL_AT_BOUNDARY],
    "a cancel was already requested": DETAIL_MESSAGES[CANCEL_REPEATED],
}
# A limit the engine's snapshot names this way follows the pipeline's declaration.
DECLARED = "declared"
LIMIT_KEYS = ("max_concurrency", "rate_limit")


@dataclass(frozen=True)
class AuditDetail:
    """An entry's detail: a code and its facts; ``english`` words a code this console does not know."""

    code: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    english: str = ""

    def sentence(self) -> str:
        """The detail in the active language (a mistake in the parameters raises: it is the writer's)."""
        if self.code in DETAIL_MESSAGES:
            return _worded(self.code, self.params)
        return detail_text(code=self.code, params=self.params, stored=self.english)

    def stored(self) -> str:
        """What the ``detail`` column keeps (English, or the form earlier releases word themselves)."""
        if self.code == RESOLUTION:
            return str(self.params.get("resolution", ""))
        if self.code == LIMITS_CHANGED:
            return json.dumps(self.params, separators=(",", ":"), sort_keys=True)
        with translation.override("en"):
            return self.sentence()


NO_DETAIL = AuditDetail()


def refusal_detail(exc: ReliabilityError) -> AuditDetail:
    """The detail of an entry recording ``exc``'s refusal: its code and facts, its English message for a code
    this console does not word."""
    return AuditDetail(code=exc.code, params=dict(exc.details), english=exc.message)


def detail_text(*, code: str, params: dict[str, Any], stored: str) -> str:
    """An entry's detail in the active language: its code worded with its parameters, else its stored text."""
    if code == RESOLUTION:
        return resolution_label(str(params.get("resolution", "")))
    if code == LIMITS_CHANGED:
        return limits_text(before=params.get("before"), after=params.get("after")) or stored
    if code in ALERT_CONFIG_DETAILS:
        return alert_config_text(code=code, params=params) or stored_detail_text(stored)
    if code not in DETAIL_MESSAGES:
        return stored_detail_text(stored)
    try:
        return _worded(code, params)
    except (KeyError, TypeError, ValueError):
        # Parameters of another release's making: its stored sentence says it.
        return stored_detail_text(stored)


def alert_config_text(*, code: str, params: dict[str, Any]) -> str | None:
    """A change to an alert rule or channel in the reader's language; None for parameters it cannot word."""
    # dlq.alerting words its own records' fields and errors: imported here, where it is needed.
    from dlq.alerting import change_texts

    if code == FIELDS_CHANGED:
        return change_texts.fields_changed_text(params)
    if code == TEST_NOT_DELIVERED:
        error = change_texts.delivery_error_text(
            code=str(params.get("error_code", "")), message=str(params.get("error", ""))
        )
        return gettext("test notification not delivered: %(error)s") % {"error": error}
    return gettext("not switched on: %(why)s") % {"why": change_texts.url_refusal_text(params)}


def _worded(code: str, params: dict[str, Any]) -> str:
    values = {name: _param_text(name, value) for name, value in params.items()}
    # The lazy message's own %: a plural one picks its form by its number parameter.
    return str(DETAIL_MESSAGES[code] % values)


def stored_detail_text(detail: str) -> str:
    """A detail as entries without a code stored it, in the reader's language where it is a fixed phrase, a
    resolution code or a limits change; anything else as stored."""
    return str(STORED_PHRASES.get(detail) or _limits_json_text(detail) or detail)


def state_label(state: str) -> str:
    """A task state's name in the reader's language (a bulk action's status for bulk entries; "" stays "")."""
    for choices in (TaskState, BulkStatus):
        if state in choices.values:
            return str(choices(state).label)
    return state


def _param_text(name: str, value: Any) -> Any:
    if name not in CODED_PARAMS or not isinstance(value, str):
        return value
    if name == "state":
        return state_label(value)
    if name == "resolution":
        return resolution_label(value)
    return action_label(value)


def limits_text(*, before: Any, after: Any) -> str | None:
    """A limits change in the reader's language ("max concurrency: as declared → 2"); None if it is not one."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    names = {"max_concurrency": gettext("max concurrency"), "rate_limit": gettext("rate limit")}
    changed = [key for key in LIMIT_KEYS if before.get(key) != after.get(key)] or list(LIMIT_KEYS)
    return "; ".join(f"{names[key]}: {_limit_text(before.get(key))} → {_limit_text(after.get(key))}" for key in changed)


def _limits_json_text(detail: str) -> str | None:
    if not detail.startswith('{"after":'):
        return None
    try:
        limits = json.loads(detail)
        return limits_text(before=limits["before"], after=limits["after"])
    except (ValueError, KeyError, TypeError):
        return None


def _limit_text(value) -> str:
    if value == DECLARED:
        return gettext("as declared")
    if value is None or value == "":
        return gettext("no limit")
    return str(value)
