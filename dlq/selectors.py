"""Reads for the operator console: failure groups and retry previews."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from urllib.parse import urlencode

from django.db import connections
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Left, Length
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from dlq.audit import DETAIL_MAX_LENGTH, REASON_MAX_LENGTH, text_bounded
from dlq.models import AuditEntry, DLQItem
from tasks import registry
from tasks.exceptions import UnknownPipeline
from tasks.models import AttemptKind, Checkpoint, SideEffect, StepAttempt

# Groups are computed over at most this many of the newest matching items,
# so the panel stays fast on a million-row table (the page says so).
GROUP_SCAN_LIMIT = 50_000
GROUP_LIMIT = 20
# A task page shows the logs of at most this many attempts (the newest that logged): each may hold 64 KB.
MAX_LOGGED_ATTEMPTS = 50


@dataclass(frozen=True)
class FailureGroup:
    fingerprint: str
    pipeline: str
    failing_step: str
    error_code: str
    count: int
    first_seen: object
    last_seen: object

    @property
    def changelist_url(self) -> str:
        """The DLQ list filtered to this group."""
        return f"{reverse('admin:dlq_dlqitem_changelist')}?{urlencode({'fingerprint': self.fingerprint})}"


def failure_groups(*, items: QuerySet[DLQItem], limit: int = GROUP_LIMIT) -> list[FailureGroup]:
    """The largest groups (pipeline + step + error code) among ``items``, with counts and first/last seen."""
    # Aggregate straight over the limited subquery: "pk IN (subquery)" makes
    # PostgreSQL hash-join against the whole table instead.
    newest = items.order_by("-created_at").values(
        "fingerprint", "pipeline", "failing_step", "error_code", "created_at"
    )[:GROUP_SCAN_LIMIT]
    sql, params = newest.query.sql_with_params()
    with connections[newest.db].cursor() as cursor:
        cursor.execute(
            "SELECT fingerprint, pipeline, failing_step, error_code, COUNT(*), MIN(created_at), MAX(created_at)"
            f" FROM ({sql}) AS newest GROUP BY 1, 2, 3, 4 ORDER BY 5 DESC, 1 LIMIT %s",
            [*params, limit],
        )
        rows = cursor.fetchall()
    return [
        FailureGroup(
            fingerprint=row[0],
            pipeline=row[1],
            failing_step=row[2],
            error_code=row[3],
            count=row[4],
            first_seen=_aware(row[5]),
            last_seen=_aware(row[6]),
        )
        for row in rows
    ]


def _aware(value):
    # Raw SQL on SQLite returns text or naive datetimes; PostgreSQL returns aware ones.
    if isinstance(value, str):
        from django.utils.dateparse import parse_datetime

        value = parse_datetime(value)
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


@dataclass(frozen=True)
class PreviewStep:
    index: int
    name: str
    runs_again: bool
    protection: str


def retry_preview(*, item: DLQItem, action: str) -> list[PreviewStep]:
    """Which steps a retry skips, which run again, and whether those are protected by effect keys."""
    task = item.task
    try:
        steps = registry.get(task.pipeline).steps
    except UnknownPipeline:
        return []
    from_start = action == "retry_from_start"
    done = set() if from_start else set(Checkpoint.objects.filter(task=task).values_list("step_name", flat=True))
    # Effects a step made through ctx.http (or ctx.idempotency_key) are in the ledger even if not declared.
    used: dict[str, set[str]] = {}
    for step_name, effect in SideEffect.objects.filter(task=task, generation=task.generation).values_list(
        "step_name", "effect_name"
    ):
        used.setdefault(step_name, set()).add(effect)
    preview = []
    for index, step in enumerate(steps):
        if step.name in done:
            preview.append(PreviewStep(index, step.name, False, _("skipped: its checkpoint is kept")))
            continue
        effects = tuple(dict.fromkeys((*step.effects, *sorted(used.get(step.name, ())))))
        if effects:
            names = ", ".join(effects)
            if from_start:
                protection = _("key-protected (%(effects)s) with new keys: it acts again") % {"effects": names}
            elif used.get(step.name):
                protection = _("key-protected (%(effects)s): the same keys as before, no second effect") % {
                    "effects": names
                }
            else:
                protection = _("key-protected (%(effects)s)") % {"effects": names}
        elif step.transactional:
            protection = _("database only, atomic with its checkpoint")
        else:
            protection = _("no declared external effects: check the step before retrying")
        preview.append(PreviewStep(index, step.name, True, protection))
    return preview


def audit_entries_for_item(*, item: DLQItem, limit: int = 50) -> list[AuditEntry]:
    """The item's newest entries, each reason and detail cut to what the log stores now (older entries may hold
    more)."""
    entries = list(
        AuditEntry.objects.filter(target_type="dlq_item", target_id=str(item.pk))
        .defer("reason", "detail")
        .annotate(
            reason_start=Left("reason", REASON_MAX_LENGTH),
            reason_length=Length("reason"),
            detail_start=Left("detail", DETAIL_MAX_LENGTH),
            detail_length=Length("detail"),
        )[:limit]
    )
    for entry in entries:
        entry.reason = text_bounded(entry.reason_start, REASON_MAX_LENGTH, length=entry.reason_length)
        entry.detail = text_bounded(entry.detail_start, DETAIL_MAX_LENGTH, length=entry.detail_length)
    return entries


@dataclass(frozen=True)
class LogLineShown:
    at: str
    level: str
    logger: str
    message: str


@dataclass(frozen=True)
class AttemptLogShown:
    """What an attempt's step logged (already redacted when it was stored), and how many lines were not kept."""

    lines: list[LogLineShown]
    dropped: int


def attempt_log_shown(log: list | None, dropped: int) -> AttemptLogShown | None:
    """An attempt row's ``log`` and ``log_dropped`` as a page shows them; None when the step logged nothing."""
    if not log and not dropped:
        return None
    lines = [
        LogLineShown(
            at=str(line.get("at", "")).replace("T", " ").removesuffix("Z"),
            level=str(line.get("level", "")),
            logger=str(line.get("logger", "")),
            message=str(line.get("message", "")),
        )
        for line in log or ()
        if isinstance(line, dict)
    ]
    return AttemptLogShown(lines, dropped)


def attempt_logs(*, task_id, limit: int = MAX_LOGGED_ATTEMPTS) -> dict[int, AttemptLogShown]:
    """The logs of the task's newest ``limit`` attempts that logged anything, by attempt row id."""
    rows = (
        StepAttempt.objects.filter(task_id=task_id)
        .filter(Q(log__isnull=False) | Q(log_dropped__gt=0))
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .values_list("id", "log", "log_dropped")[:limit]
    )
    return {pk: shown for pk, log, dropped in rows if (shown := attempt_log_shown(log, dropped)) is not None}


def failing_attempt(*, item: DLQItem) -> StepAttempt | None:
    """The last attempt of the item's failing step (its log and outcome), or None if that step never ran."""
    if not item.failing_step:
        return None
    return (
        StepAttempt.objects.filter(task_id=item.task_id, kind=AttemptKind.STEP, step_name=item.failing_step)
        .defer("traceback")
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .first()
    )
