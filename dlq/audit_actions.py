"""The actions the audit log records: each action's code, and its name in the reader's language.

An entry stores its action as a code (``AuditEntry.action``) and pages word it
when they show it, as a detail that names an action does (``dlq.audit_details``).
The codes and their names live here, below every module that writes an entry
(``dlq.actions``, ``dlq.control_audit``, ``dlq.client_audit``, ``dlq.audit``)
and the module that words its detail, so that each of them imports this one and
none of them another.
"""

from __future__ import annotations

import functools

from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

# The operator's actions on a dead letter (dlq.actions), by their names; a bulk action takes one on each item.
DEAD_LETTER_ACTION_LABELS = {
    "retry": _("Retry from checkpoint"),
    "retry_from_start": _("Retry from start"),
    "compensate": _("Compensate"),
    "close": _("Close"),
}

# Live control (dlq.control_audit writes the engine's changes, dlq.live_actions the console's refusals).
TASK_CANCELLED = "task_cancelled"
PIPELINE_PAUSED = "pipeline_paused"
PIPELINE_RESUMED = "pipeline_resumed"
PIPELINE_LIMITS_SET = "pipeline_limits_set"
PIPELINE_LIMITS_RESET = "pipeline_limits_reset"
# The audited actions' names in the reader's language (the audit log, the dashboard, the task page).
LIVE_ACTION_LABELS = {
    TASK_CANCELLED: _("Cancel task"),
    PIPELINE_PAUSED: _("Pause pipeline"),
    PIPELINE_RESUMED: _("Resume pipeline"),
    PIPELINE_LIMITS_SET: _("Set pipeline limits"),
    PIPELINE_LIMITS_RESET: _("Reset pipeline limits"),
}

# Schedules (dlq.control_audit writes the engine's changes, dlq.schedule_actions the console's refusals); the codes
# are the engine's (tasks.lifecycle.schedules).
SCHEDULE_ADDED = "schedule_added"
SCHEDULE_CHANGED = "schedule_changed"
SCHEDULE_PAUSED = "schedule_paused"
SCHEDULE_RESUMED = "schedule_resumed"
SCHEDULE_ACTION_LABELS = {
    SCHEDULE_ADDED: _("Add schedule"),
    SCHEDULE_CHANGED: _("Change schedule"),
    SCHEDULE_PAUSED: _("Pause schedule"),
    SCHEDULE_RESUMED: _("Resume schedule"),
}

# The approval inbox (dlq.approvals): a decision on a task waiting at an approval wait, and its refusals.
APPROVAL_APPROVED = "approval_approved"
APPROVAL_REJECTED = "approval_rejected"
APPROVAL_ACTION_LABELS = {
    APPROVAL_APPROVED: _("Approve task"),
    APPROVAL_REJECTED: _("Reject task"),
}

# API clients (dlq.client_audit). "revoke_apiclient" is also the admin's list action's denial
# ("<action>_<model>"), so one filter shows every attempt.
CLIENT_CREATED = "create_apiclient"
CLIENT_REVOKED = "revoke_apiclient"
CLIENT_SECRET_ROTATED = "rotate_secret_apiclient"
CLIENT_ACTION_LABELS = {
    CLIENT_CREATED: _("Create API client"),
    CLIENT_REVOKED: _("Revoke API client"),
    CLIENT_SECRET_ROTATED: _("Rotate an API client's signing secret"),
}

# The audit log's own retention purge (dlq.audit).
AUDIT_PURGE_ACTION = "audit_purged"

# Audited actions of bulk operations and of the console itself, by code.
OTHER_ACTION_LABELS = {
    "bulk_request": _("Request bulk action"),
    "bulk_approve": _("Approve bulk action"),
    "bulk_pause": _("Pause bulk action"),
    "bulk_resume": _("Resume bulk action"),
    "bulk_cancel": _("Cancel bulk action"),
    "bulk_canary_stop": _("Bulk action stopped by its canary"),
    "bulk_complete": _("Bulk action completed"),
    AUDIT_PURGE_ACTION: _("Audit entries purged"),
}
# A model page's write, or a list action on its rows, audited as "<verb>_<model>" (dlq.admin.common; alert rules
# and channels, done or denied, by dlq.alerting.config_changes).
MODEL_VERB_LABELS = {
    "add": _("Add %(model)s"),
    "change": _("Change %(model)s"),
    "delete": _("Delete %(model)s"),
    "enable": _("Enable %(model)s"),
    "disable": _("Disable %(model)s"),
    "test": _("Send a test notification to %(model)s"),
}


def action_label(code: str) -> str:
    """An audited action's name in the reader's language; a code this release does not know is shown as it is."""
    label = (
        DEAD_LETTER_ACTION_LABELS.get(code)
        or LIVE_ACTION_LABELS.get(code)
        or SCHEDULE_ACTION_LABELS.get(code)
        or APPROVAL_ACTION_LABELS.get(code)
        or CLIENT_ACTION_LABELS.get(code)
        or OTHER_ACTION_LABELS.get(code)
    )
    if label is not None:
        return str(label)
    prefix, _sep, rest = code.partition("_")
    if prefix == "bulk" and rest in DEAD_LETTER_ACTION_LABELS:
        # A denied bulk action, named by the dead-letter action it would take.
        return gettext("Bulk: %(action)s") % {"action": DEAD_LETTER_ACTION_LABELS[rest]}
    if prefix in MODEL_VERB_LABELS and rest:
        model = _model_verbose_name(rest)
        if model:
            return str(MODEL_VERB_LABELS[prefix]) % {"model": model}
    return code


def _model_verbose_name(model_name: str) -> str:
    model = _models_by_name().get(model_name)
    return str(model._meta.verbose_name) if model else ""


@functools.cache
def _models_by_name() -> dict:
    """The installed models by model name (the first of a name, as apps lists them): read once, after start-up."""
    from django.apps import apps

    found: dict = {}
    for model in apps.get_models():
        found.setdefault(model._meta.model_name, model)
    return found
