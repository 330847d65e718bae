"""The audit log: one append-only entry per operator action, denied and refused ones included.

Entries are kept forever unless ``RELIABILITY_AUDIT_RETENTION_DAYS`` is set;
then ``audit_entries_purge`` deletes the older ones, the one deletion the
append-only trigger allows (migration 0009), and audits it in the same
transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from dlq.audit_actions import AUDIT_PURGE_ACTION
from dlq.audit_details import AUDIT_PURGED, NO_DETAIL, PERMISSION_DENIED, AuditDetail
from dlq.conf import console_settings
from dlq.models import AuditEntry, AuditOutcome
from reliability_console.refusal_log import refusal_logged
from tasks.conf import engine_settings
from tasks.lifecycle import PurgeRun, purge_batches, retention_purge_record

logger = logging.getLogger(__name__)

AUDIT_PURGE_KIND = "audit_entries"
# Who the purge's own entries name as the actor.
RETENTION_ACTOR = "system:retention"
# Entries per transaction: each is one DELETE and one audit entry saying so.
AUDIT_PURGE_BATCH_SIZE = 5000
# A sweeper run purges for at most this long (the sweep it belongs to waits for it).
SWEEPER_RUN_SECONDS = 5.0
# The most an entry stores of its free-text fields. An allowed user's longer reason is refused with a form error
# before anything is written (dlq.actions, dlq.bulk); a denied request's is cut here, marked, so an unprivileged
# POST cannot grow the append-only log (or the pages that show it) by more than this.
REASON_MAX_LENGTH = 1000
DETAIL_MAX_LENGTH = 2000
# A detail's parameter (a pipeline's name, an engine's error) is cut to this: the sentence made of them stays short.
DETAIL_PARAM_MAX_LENGTH = 200
TRUNCATED_MARKER = "… [truncated: {length} characters in all]"


def text_bounded(text: str, limit: int, *, length: int | None = None) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and a marker saying how long it was.

    ``length``: the whole text's length when ``text`` is only its start (read with ``Left`` from the database).
    """
    text = text or ""
    length = len(text) if length is None else length
    if length <= limit:
        return text
    marker = TRUNCATED_MARKER.format(length=length)
    return text[: max(limit - len(marker), 0)] + marker


def audit_record(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    outcome: str,
    task_id=None,
    state_before: str = "",
    state_after: str = "",
    reason: str = "",
    detail: AuditDetail = NO_DETAIL,
    client_ip: str | None = None,
    bulk_operation_id: int | None = None,
) -> AuditEntry:
    """Append one entry, its free text bounded. Call it inside the transaction of the change it records.

    ``detail`` is a code and its facts (``dlq.audit_details``), stored with its English sentence and worded in
    the reader's language when shown.
    """
    detail = AuditDetail(code=detail.code[:50], params=_params_bounded(detail.params), english=detail.english)
    return AuditEntry.objects.create(
        actor=actor[:150],
        action=action[:50],
        target_type=target_type[:50],
        target_id=str(target_id)[:64],
        task_id=task_id,
        state_before=state_before or "",
        state_after=state_after or "",
        reason=text_bounded(reason, REASON_MAX_LENGTH),
        outcome=outcome,
        detail=text_bounded(detail.stored(), DETAIL_MAX_LENGTH),
        detail_code=detail.code,
        detail_params=detail.params,
        client_ip=client_ip,
        bulk_operation_id=bulk_operation_id,
    )


def _params_bounded(params: dict) -> dict:
    def bounded(value):
        if isinstance(value, str):
            return text_bounded(value, DETAIL_PARAM_MAX_LENGTH)
        if isinstance(value, dict):
            return {str(key)[:DETAIL_PARAM_MAX_LENGTH]: bounded(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [bounded(item) for item in value]
        return value if value is None or isinstance(value, bool | int | float) else bounded(str(value))

    return {str(key)[:DETAIL_PARAM_MAX_LENGTH]: bounded(value) for key, value in params.items()}


def audit_denied(
    *, actor: str, action: str, target_type: str, target_id: str, client_ip: str | None, reason: str = ""
) -> AuditEntry:
    """Record an attempt the actor had no permission for, and log it as one line.

    A refusal is an expected event, not an error: the line replaces Django's warning with a traceback for the
    same 403 (``reliability_console.refusal_log``).
    """
    entry = audit_record(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        outcome=AuditOutcome.DENIED,
        reason=reason,
        detail=AuditDetail(PERMISSION_DENIED),
        client_ip=client_ip,
    )
    logger.warning(
        "permission denied",
        extra={
            "event": "permission_denied",
            "actor": entry.actor,
            "action": entry.action,
            "target_type": entry.target_type,
            "target_id": entry.target_id,
            "client_ip": client_ip or "",
        },
    )
    refusal_logged()
    return entry


@dataclass(kw_only=True)
class AuditPurgeReport(PurgeRun):
    cutoff: datetime
    dry_run: bool
    entries: int = 0

    def as_log(self) -> dict:
        return {
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "entries": self.entries,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
        }


def audit_entries_purge(
    *,
    older_than: timedelta,
    batch_size: int = AUDIT_PURGE_BATCH_SIZE,
    dry_run: bool = False,
    max_seconds: float | None = None,
    pause_ratio: float = 0.0,
    on_batch: Callable[[PurgeRun], None] | None = None,
) -> AuditPurgeReport:
    """Delete audit entries created more than ``older_than`` ago, oldest first, ``batch_size`` per transaction.

    Each transaction deletes one batch and appends an ``audit_purged`` entry
    with the count and the cutoff: the log records its own purges. With
    ``dry_run`` it counts the entries it would delete and changes nothing.
    ``max_seconds``, ``pause_ratio`` and ``on_batch`` as for the task purge
    (``tasks.lifecycle.retention.purge_batches``).
    """
    cutoff = timezone.now() - older_than
    report = AuditPurgeReport(cutoff=cutoff, dry_run=dry_run)

    def batch(after):
        if dry_run:
            found = _old_entries(cutoff, after, batch_size)
            report.entries += len(found)
            return found
        with transaction.atomic():
            found = _old_entries(cutoff, after, batch_size)
            if found:
                report.entries += _delete_audited(cutoff, older_than, [pk for _, pk in found])
            return found

    purge_batches(
        run=report,
        batch=batch,
        batch_size=batch_size,
        max_seconds=max_seconds,
        pause_ratio=0.0 if dry_run else pause_ratio,
        on_batch=on_batch,
    )
    if not dry_run:
        retention_purge_record(
            kind=AUDIT_PURGE_KIND,
            cutoff=cutoff,
            items=report.entries,
            rows=report.entries,
            seconds=report.seconds,
            complete=report.complete,
        )
    if report.entries or dry_run:
        logger.info("audit entries purged", extra={"event": "audit_entries_purged", **report.as_log()})
    return report


def audit_entries_purge_due() -> int:
    """The sweeper's chore: one bounded run when ``RELIABILITY_AUDIT_RETENTION_DAYS`` is set; entries deleted."""
    days = console_settings.AUDIT_RETENTION_DAYS
    if not days:
        return 0
    report = audit_entries_purge(
        older_than=timedelta(days=days),
        max_seconds=SWEEPER_RUN_SECONDS,
        pause_ratio=engine_settings.PURGE_PAUSE_RATIO,
    )
    return report.entries


def _old_entries(cutoff: datetime, after: tuple[datetime, int] | None, batch_size: int) -> list[tuple[datetime, int]]:
    entries = AuditEntry.objects.filter(created_at__lt=cutoff)
    if after is not None:
        # Start where the last batch ended: a run never walks again over the index entries it deleted.
        created_at, pk = after
        entries = entries.filter(created_at__gte=created_at).exclude(created_at=created_at, pk__lte=pk)
    return list(entries.order_by("created_at", "pk").values_list("created_at", "pk")[:batch_size])


def _delete_audited(cutoff: datetime, older_than: timedelta, ids: list[int]) -> int:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Transaction-local (gone at commit, so nothing leaks through a pooled connection): the trigger lets
            # this transaction delete entries created before the cutoff, and nothing else.
            cursor.execute("SELECT set_config('reliability.audit_purge_before', %s, true)", [cutoff.isoformat()])
    deleted, _ = AuditEntry.objects.filter(pk__in=ids, created_at__lt=cutoff).delete()
    if deleted:
        audit_record(
            actor=RETENTION_ACTOR,
            action=AUDIT_PURGE_ACTION,
            target_type="audit_log",
            target_id=cutoff.isoformat(),
            outcome=AuditOutcome.SUCCEEDED,
            detail=AuditDetail(
                AUDIT_PURGED,
                {"count": deleted, "cutoff": cutoff.isoformat(), "days": f"{older_than.total_seconds() / 86400:g}"},
            ),
        )
    return deleted
