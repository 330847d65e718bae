"""How the audit log words a change to an alert rule or channel, in the reader's language.

The entry stores facts (``dlq.alerting.config_changes``): which fields
changed and their values before and after, a test notification's error code.
Here they become a sentence when a page shows them: a field by its verbose
name, a choice by its label, a boolean as yes or no, and a credential only as
"changed" (its value was never stored).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import FieldDoesNotExist
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.alerting.url_checks import refusal_text

# Why a test notification was not delivered, by the send path's error code (dlq.alerting.channels).
DELIVERY_ERRORS = {
    "timeout": _("no answer in time"),
    "connection_error": _("the connection failed"),
    "alert_request_invalid": _("the request could not be sent"),
    "alert_no_url": _("the channel has no URL"),
    "alert_no_recipients": _("the channel has no e-mail addresses"),
    "alert_email_failed": _("the mail server did not take the message"),
    "alert_redirect": _("the receiver answered with a redirect, which alerts do not follow"),
    "alert_url_refused": _("its URL was refused, and the channel is switched off"),
}
HTTP_PREFIX = "http_"


def delivery_error_text(*, code: str, message: str) -> str:
    """A send error in the reader's language; a code this release does not word is shown by its message."""
    if code in DELIVERY_ERRORS:
        return str(DELIVERY_ERRORS[code])
    status = code.removeprefix(HTTP_PREFIX)
    if code.startswith(HTTP_PREFIX) and status.isdigit():
        return gettext("the receiver answered HTTP %(status)s") % {"status": status}
    return message or code


def url_refusal_text(params: dict[str, Any]) -> str:
    """Why a channel's URL may not be sent to (an enable refused), in the reader's language."""
    return refusal_text(str(params.get("rule", "")), params)


def fields_changed_text(params: dict[str, Any]) -> str | None:
    """ "threshold: 5 → 10; secret: changed"; None when the parameters are not a list of changes."""
    changes = params.get("fields")
    if not isinstance(changes, list):
        return None
    model = _model(params.get("model"))
    parts = []
    for change in changes:
        if not isinstance(change, dict) or not isinstance(change.get("field"), str):
            return None
        field = _field(model, change["field"])
        label = str(field.verbose_name) if field is not None else change["field"]
        if change.get("changed"):
            parts.append(f"{label}: {gettext('changed')}")
        elif "before" in change and "after" in change:
            parts.append(f"{label}: {_value(field, change['before'])} → {_value(field, change['after'])}")
        else:
            parts.append(f"{label}: {_value(field, change.get('after', change.get('before')))}")
    return "; ".join(parts)


def _model(label: Any):
    try:
        return apps.get_model(str(label))
    except (LookupError, ValueError):
        return None


def _field(model, name: str):
    if model is None:
        return None
    try:
        return model._meta.get_field(name)
    except FieldDoesNotExist:
        return None


def _value(field, value: Any) -> str:
    if isinstance(value, bool):
        return gettext("yes") if value else gettext("no")
    if value is None or value == "" or value == []:
        return gettext("(empty)")
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    choices = dict(field.flatchoices) if field is not None and field.choices else {}
    return str(choices.get(value, value))
