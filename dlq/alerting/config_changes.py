"""Changes to alert rules and channels made in the console, each audited in the transaction that makes it.

An entry names its record by target type (``alert_rule``, ``alert_channel``)
and pk, its action by the admin's verb and the model (``change_alertrule``,
``enable_alertchannel``: the code a denial of the same request gets from
``dlq.admin.common.DenialsAuditedMixin``), and its actor by username. Its
detail is the diff of the fields the console edits, before and after
(``FIELDS_CHANGED``, worded by ``dlq.alerting.change_texts``). A channel's URL
and secret are credentials (``dlq.alerting.masking``): the log records that
they changed, never a value, so the audit log shows them to no one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F

from dlq.alerting.channels import channel_test_send
from dlq.alerting.masking import secrets_scrubbed
from dlq.alerting.models import AlertChannel, AlertRule
from dlq.alerting.url_checks import channel_url_refusal
from dlq.audit import audit_record
from dlq.audit_details import CHANNEL_URL_REFUSED, FIELDS_CHANGED, TEST_DELIVERED, TEST_NOT_DELIVERED, AuditDetail
from dlq.models import AuditEntry, AuditOutcome
from tasks.exceptions import ReliabilityError

logger = logging.getLogger(__name__)

TARGET_TYPES = {AlertRule: "alert_rule", AlertChannel: "alert_channel"}
# The fields the console's forms edit, in their order; the rest is the evaluator's and the senders' bookkeeping
# (a rule's state and version, a channel's failure counters and why the engine switched it off).
AUDITED_FIELDS: dict[type, tuple[str, ...]] = {
    AlertRule: (
        "name",
        "kind",
        "pipeline",
        "enabled",
        "threshold",
        "window_seconds",
        "lookback_days",
        "channels",
        "renotify_seconds",
    ),
    AlertChannel: ("name", "kind", "enabled", "url", "secret", "email_to"),
}
# Whoever reads them can send or forge notifications: recorded only as changed.
CREDENTIAL_FIELDS = ("url", "secret")
EMPTY_VALUES = ("", None, [])
ADD, CHANGE, DELETE, ENABLE, DISABLE, TEST = "add", "change", "delete", "enable", "disable", "test"

AlertConfig = AlertRule | AlertChannel


def config_snapshot(record: AlertConfig, *, channels: Iterable[AlertChannel] | None = None) -> dict[str, Any]:
    """The audited fields' values; a rule's channels by name (``channels``: as a form is about to set them)."""
    values: dict[str, Any] = {}
    for name in AUDITED_FIELDS[type(record)]:
        if name == "channels":
            chosen = channels if channels is not None else (record.channels.all() if record.pk else [])
            values[name] = sorted(channel.name for channel in chosen)
        else:
            values[name] = getattr(record, name)
    return values


def config_diff(*, before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The changed fields in order, each ``{"field", "before", "after"}``; a credential only ``{"field",
    "changed": true}``. A new record (``before`` None) has only "after" and a deleted one only "before", empty
    values left out."""
    changes = []
    for name in after if after is not None else before or {}:
        old = before.get(name) if before is not None else None
        new = after.get(name) if after is not None else None
        if before is not None and after is not None and old == new:
            continue
        if (before is None and new in EMPTY_VALUES) or (after is None and old in EMPTY_VALUES):
            continue
        change: dict[str, Any] = {"field": name}
        if name in CREDENTIAL_FIELDS:
            change["changed"] = True
        else:
            if before is not None:
                change["before"] = old
            if after is not None:
                change["after"] = new
        changes.append(change)
    return changes


def alert_config_save(
    *,
    record: AlertConfig,
    changed_fields: Sequence[str] | None,
    actor: str,
    client_ip: str | None = None,
    channels: Iterable[AlertChannel] | None = None,
) -> AuditEntry | None:
    """Save a rule or channel as the console's form changed it, and audit the change in the same transaction.

    ``changed_fields``: the form's changed fields, None for a new record. ``channels``: a rule's channels as the
    form will set them (Django saves a many-to-many field after the row, in this transaction). A rule's edit
    writes only the changed fields and bumps its version, so an evaluator that read the rule before the edit
    loses its transition instead of undoing the edit. A save that changed nothing writes no entry.
    """
    model = type(record)
    with transaction.atomic():
        if changed_fields is None:
            record.save()
            before, verb = None, ADD
        else:
            # Locked: the diff is against the row this save replaces, not one a concurrent edit replaced already.
            before, verb = config_snapshot(model.objects.select_for_update().get(pk=record.pk)), CHANGE
            if model is AlertRule:
                fields = [name for name in changed_fields if name != "channels"]
                if fields:
                    record.save(update_fields=fields)
                AlertRule.objects.filter(pk=record.pk).update(version=F("version") + 1)
            else:
                record.save()
        changes = config_diff(before=before, after=config_snapshot(record, channels=channels))
        if not changes:
            return None
        return _audited(verb, model, record.pk, changes, actor=actor, client_ip=client_ip)


def alert_config_delete(*, records: Iterable[AlertConfig], actor: str, client_ip: str | None = None) -> int:
    """Delete rules or channels, each audited with the values it had, in one transaction; how many."""
    deleted = 0
    with transaction.atomic():
        for record in records:
            before, pk = config_snapshot(record), record.pk
            record.delete()
            _audited(DELETE, type(record), pk, config_diff(before=before, after=None), actor=actor, client_ip=client_ip)
            deleted += 1
    return deleted


@dataclass
class EnabledChange:
    """What switching records on or off did: which changed and which were so already (by pk), which were refused
    (a channel whose URL may not be sent to, by name) and why, as the refusal's code and facts."""

    changed: list[int] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)


def alert_config_enabled_set(
    *, model: type, ids: Iterable[int], enabled: bool, actor: str, client_ip: str | None = None
) -> EnabledChange:
    """Switch the chosen rules or channels on or off, one audited entry per record that changed.

    A rule's version is bumped, as by an edit. A channel that sends to a URL is switched on only if the URL
    passes the checks a save would make (``dlq.alerting.url_checks``); its engine-set reason for being off is
    then cleared, as a save clears it. A refusal is audited too.
    """
    result = EnabledChange()
    verb = ENABLE if enabled else DISABLE
    with transaction.atomic():
        for record in model.objects.select_for_update().filter(pk__in=list(ids)).order_by("pk"):
            if record.enabled == enabled:
                result.unchanged.append(record.pk)
                continue
            refusal = (
                channel_url_refusal(kind=record.kind, url=record.url) if enabled and model is AlertChannel else None
            )
            if refusal is not None:
                result.refused[record.name] = refusal
                audit_record(
                    actor=actor,
                    action=f"{verb}_{model._meta.model_name}",
                    target_type=TARGET_TYPES[model],
                    target_id=str(record.pk),
                    outcome=AuditOutcome.REFUSED,
                    detail=AuditDetail(CHANNEL_URL_REFUSED, refusal),
                    client_ip=client_ip,
                )
                continue
            update: dict[str, Any] = {"enabled": enabled}
            if model is AlertRule:
                update["version"] = F("version") + 1
            elif enabled:
                update.update(disabled_reason_code="", disabled_reason_params={}, disabled_at=None)
            model.objects.filter(pk=record.pk).update(**update)
            change = {"field": "enabled", "before": record.enabled, "after": enabled}
            _audited(verb, model, record.pk, [change], actor=actor, client_ip=client_ip)
            result.changed.append(record.pk)
    return result


@dataclass(frozen=True)
class ChannelTestResult:
    """A test notification's outcome; ``error_code`` and ``error`` (without the URL or secret) when it failed."""

    delivered: bool
    error_code: str = ""
    error: str = ""


def alert_channel_test(*, channel: AlertChannel, actor: str, client_ip: str | None = None) -> ChannelTestResult:
    """Send one test notification on ``channel`` now (``channels.channel_test_send``) and audit its outcome."""
    try:
        channel_test_send(channel=channel)
    except ReliabilityError as exc:
        # The senders' messages never quote the URL; scrubbed all the same, as every stored error text is.
        result = ChannelTestResult(delivered=False, error_code=exc.code, error=secrets_scrubbed(exc.message, channel))
        detail = AuditDetail(TEST_NOT_DELIVERED, {"error_code": result.error_code, "error": result.error})
    else:
        result, detail = ChannelTestResult(delivered=True), AuditDetail(TEST_DELIVERED)
    audit_record(
        actor=actor,
        action=f"{TEST}_{AlertChannel._meta.model_name}",
        target_type=TARGET_TYPES[AlertChannel],
        target_id=str(channel.pk),
        outcome=AuditOutcome.SUCCEEDED if result.delivered else AuditOutcome.FAILED,
        detail=detail,
        client_ip=client_ip,
    )
    logger.info(
        "alert channel tested",
        extra={
            "event": "alert_channel_tested",
            "channel_id": channel.pk,
            "delivered": result.delivered,
            "error_code": result.error_code,
            "actor": actor,
        },
    )
    return result


def _audited(
    verb: str, model: type, pk: int, changes: list[dict[str, Any]], *, actor: str, client_ip: str | None
) -> AuditEntry:
    return audit_record(
        actor=actor,
        action=f"{verb}_{model._meta.model_name}",
        target_type=TARGET_TYPES[model],
        target_id=str(pk),
        outcome=AuditOutcome.SUCCEEDED,
        detail=AuditDetail(FIELDS_CHANGED, {"model": model._meta.label_lower, "fields": changes}),
        client_ip=client_ip,
    )
