"""Bulk actions, by filter or on selected rows, with a blast-radius limit.

A bulk action freezes the ids of the items matching a filter (or the rows an
operator selected: two or more selected items are a bulk action, with every
rule below; one is a single action), then works
through them in the background: first a canary batch, which stops the whole
operation when its failure rate passes the threshold, then the rest at a
rate limit. An operator can pause, resume or cancel it; one over
``RELIABILITY_BULK_APPROVAL_THRESHOLD`` items waits for a second person with
the approve permission (never the requester).

Work happens in short RQ jobs that each claim a slice of items with a
compare-and-set on ``processed`` (so two jobs never act on the same item),
then re-enqueue themselves; the sweeper re-delivers a running operation whose
job was lost.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from redis.exceptions import RedisError

from dlq.actions import (
    ACTIONS,
    MAX_REASON_LENGTH,
    ActionDenied,
    ActionRefused,
    ActionResult,
    ReasonRequired,
    dlq_item_act,
)
from dlq.audit import audit_denied, audit_record, text_bounded
from dlq.audit_details import BULK_ITEMS, BULK_SELF_APPROVAL, CANARY_FAILED, AuditDetail
from dlq.conf import console_settings
from dlq.models import AuditOutcome, BulkOperation, BulkStatus
from tasks.exceptions import ReliabilityError
from tasks.lifecycle import entry_point_deliver
from tasks.models import ResolutionCode

logger = logging.getLogger(__name__)

RUN_BULK_ENTRY_POINT = "dlq.jobs.run_bulk_operation"
BULK_PERMISSION = "dlq.bulk_dlqitem"
APPROVE_PERMISSION = "dlq.approve_bulk_dlqitem"
COMMAND_LABELS = {
    "approve": _("Approve (four eyes)"),
    "pause": _("Pause"),
    "resume": _("Resume"),
    "cancel": _("Cancel"),
}
# What a holder of the bulk permission can do to an operation in each status.
COMMANDS_BY_STATUS = {
    BulkStatus.RUNNING: ("pause", "cancel"),
    BulkStatus.PAUSED: ("resume", "cancel"),
    BulkStatus.AWAITING_APPROVAL: ("cancel",),
}
# One job works for about this long, then hands over to the next (keeps a worker free for tasks).
SLICE_SECONDS = 2.0
MAX_ITEMS = 100_000
# Each item's reason is the operation's with this in front; room is kept for an id of up to 10 digits.
BULK_REASON_PREFIX = "[bulk #{id}] "
BULK_REASON_MAX_LENGTH = MAX_REASON_LENGTH - len(BULK_REASON_PREFIX.format(id=10**10 - 1))
MAX_FILTER_QUERY_LENGTH = 2000
STALE_AFTER_SECONDS = 30


class BulkRefused(ReliabilityError):
    code = "bulk_refused"


def bulk_operation_request(
    *,
    actor,
    action: str,
    item_ids: list[int],
    filter_query: str,
    reason: str,
    resolution_code: str = "",
    client_ip: str | None = None,
) -> BulkOperation:
    """Create a bulk operation over ``item_ids`` (the items matching ``filter_query``)."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise BulkRefused(f"unknown action {action!r}")
    username = actor.get_username()
    if not (actor.has_perm(BULK_PERMISSION) and actor.has_perm(spec.permission)):
        audit_denied(
            actor=username,
            action=f"bulk_{action}",
            target_type="bulk_operation",
            target_id="new",
            client_ip=client_ip,
            reason=reason,
        )
        raise ActionDenied(gettext("you may not start this bulk action"))
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired(gettext("give a reason: it goes into the audit log"))
    if len(reason) > BULK_REASON_MAX_LENGTH:
        # Checked here, prefix included: found item by item, it would fail every item instead.
        raise ReasonRequired(
            gettext("the reason of a bulk action must be at most %(n)d characters (each item's adds the bulk number)")
            % {"n": BULK_REASON_MAX_LENGTH}
        )
    if action == "close" and resolution_code not in ResolutionCode.values:
        raise ReasonRequired(gettext("choose a resolution code"))
    if not item_ids:
        raise BulkRefused(gettext("no items match this filter"))
    if len(item_ids) > MAX_ITEMS:
        raise BulkRefused(gettext("at most %(n)d items per bulk action; narrow the filter") % {"n": MAX_ITEMS})
    needs_approval = len(item_ids) > console_settings.BULK_APPROVAL_THRESHOLD
    with transaction.atomic():
        operation = BulkOperation.objects.create(
            action=action,
            filter_query=text_bounded(filter_query, MAX_FILTER_QUERY_LENGTH),
            item_ids=list(item_ids),
            reason=reason,
            resolution_code=resolution_code if action == "close" else "",
            requested_by=username,
            status=BulkStatus.AWAITING_APPROVAL if needs_approval else BulkStatus.RUNNING,
            total=len(item_ids),
            canary_size=console_settings.BULK_CANARY_SIZE,
            canary_max_failure_rate=console_settings.BULK_CANARY_MAX_FAILURE_RATE,
            rate_per_second=console_settings.BULK_RATE_PER_SECOND,
            client_ip=client_ip,
        )
        _audit(operation, username, "bulk_request", "", operation.status, reason, client_ip)
        if not needs_approval:
            transaction.on_commit(lambda: bulk_operation_deliver(operation_id=operation.pk))
    return operation


def dlq_selection_act(
    *,
    actor,
    action: str,
    item_ids: list[int],
    reason: str,
    resolution_code: str = "",
    client_ip: str | None = None,
    query: str = "",
) -> ActionResult | BulkOperation:
    """The console's "selected rows": one item is a single action, two or more a bulk operation over exactly them.

    Acting on many items at once is what the bulk rules exist for, however
    the items were chosen: the bulk permission, a second supervisor over
    ``RELIABILITY_BULK_APPROVAL_THRESHOLD`` items, the canary, the rate limit.
    ``query`` is the selection's query string, recorded as the operation's filter.
    """
    ids = list(dict.fromkeys(item_ids))
    if len(ids) == 1:
        return dlq_item_act(
            item_id=ids[0],
            action=action,
            actor=actor,
            reason=reason,
            client_ip=client_ip,
            resolution_code=resolution_code,
        )
    return bulk_operation_request(
        actor=actor,
        action=action,
        item_ids=ids,
        filter_query=query,
        reason=reason,
        resolution_code=resolution_code,
        client_ip=client_ip,
    )


def bulk_operation_approve(*, actor, operation_id: int, client_ip: str | None = None) -> BulkOperation:
    """Four eyes: a supervisor other than the requester lets a large operation run."""
    username = actor.get_username()
    if not actor.has_perm(APPROVE_PERMISSION):
        audit_denied(
            actor=username,
            action="bulk_approve",
            target_type="bulk_operation",
            target_id=str(operation_id),
            client_ip=client_ip,
        )
        raise ActionDenied(gettext("you may not approve bulk actions"))
    requested = BulkOperation.objects.filter(pk=operation_id).first()
    if requested is None:
        raise BulkRefused(gettext("no such bulk action"))
    if requested.requested_by == username:
        refusal = AuditDetail(BULK_SELF_APPROVAL)
        _audit(
            requested,
            username,
            "bulk_approve",
            requested.status,
            requested.status,
            "",
            client_ip,
            refused=True,
            detail=refusal,
        )
        raise BulkRefused(refusal.sentence())
    with transaction.atomic():
        operation = BulkOperation.objects.select_for_update().filter(pk=operation_id).first()
        if operation is None:
            raise BulkRefused(gettext("no such bulk action"))
        if operation.status != BulkStatus.AWAITING_APPROVAL:
            raise BulkRefused(
                gettext("this bulk action is %(status)s, not awaiting approval") % {"status": operation.status}
            )
        before = operation.status
        operation.status = BulkStatus.RUNNING
        operation.approved_by = username
        operation.save(update_fields=["status", "approved_by", "updated_at"])
        _audit(operation, username, "bulk_approve", before, operation.status, "", client_ip)
        transaction.on_commit(lambda: bulk_operation_deliver(operation_id=operation.pk))
    return operation


def bulk_operation_commands(*, operation: BulkOperation, actor) -> list[tuple[str, str]]:
    """(command, label) of what ``actor`` may do to ``operation`` now, for its page's buttons."""
    commands: list[tuple[str, str]] = []
    if actor.has_perm(BULK_PERMISSION):
        commands += [(command, COMMAND_LABELS[command]) for command in COMMANDS_BY_STATUS.get(operation.status, ())]
    if (
        operation.status == BulkStatus.AWAITING_APPROVAL
        and actor.has_perm(APPROVE_PERMISSION)
        and actor.get_username() != operation.requested_by
    ):
        commands.insert(0, ("approve", COMMAND_LABELS["approve"]))
    return commands


def bulk_operation_command(*, actor, operation_id: int, command: str, client_ip: str | None = None) -> BulkOperation:
    """Approve, pause, resume or cancel a bulk operation (each checks its own permission)."""
    if command == "approve":
        return bulk_operation_approve(actor=actor, operation_id=operation_id, client_ip=client_ip)
    return bulk_operation_control(actor=actor, operation_id=operation_id, command=command, client_ip=client_ip)


TRANSITIONS = {
    "pause": ((BulkStatus.RUNNING,), BulkStatus.PAUSED),
    "resume": ((BulkStatus.PAUSED,), BulkStatus.RUNNING),
    "cancel": ((BulkStatus.RUNNING, BulkStatus.PAUSED, BulkStatus.AWAITING_APPROVAL), BulkStatus.CANCELLED),
}


def bulk_operation_control(*, actor, operation_id: int, command: str, client_ip: str | None = None) -> BulkOperation:
    """Pause, resume or cancel a bulk operation."""
    username = actor.get_username()
    if command not in TRANSITIONS:
        raise BulkRefused(f"unknown command {command!r}")
    if not actor.has_perm(BULK_PERMISSION):
        audit_denied(
            actor=username,
            action=f"bulk_{command}",
            target_type="bulk_operation",
            target_id=str(operation_id),
            client_ip=client_ip,
        )
        raise ActionDenied(gettext("you may not control bulk actions"))
    sources, target = TRANSITIONS[command]
    with transaction.atomic():
        operation = BulkOperation.objects.select_for_update().filter(pk=operation_id).first()
        if operation is None:
            raise BulkRefused(gettext("no such bulk action"))
        if operation.status not in sources:
            raise BulkRefused(
                gettext("cannot %(command)s a bulk action that is %(status)s")
                % {"command": command, "status": operation.status}
            )
        before = operation.status
        operation.status = target
        if target == BulkStatus.CANCELLED:
            operation.finished_at = timezone.now()
        operation.save(update_fields=["status", "finished_at", "updated_at"])
        _audit(operation, username, f"bulk_{command}", before, target, "", client_ip)
        if target == BulkStatus.RUNNING:
            transaction.on_commit(lambda: bulk_operation_deliver(operation_id=operation.pk))
    return operation


def bulk_operation_deliver(*, operation_id: int, delay: float = 0.0) -> bool:
    # The operation's own job runs on the default queue: an operator's action must not wait behind a
    # bulk backlog. The tasks it retries go back on their pipelines' queues (tasks.lifecycle.operator delivers them).
    try:
        entry_point_deliver(RUN_BULK_ENTRY_POINT, operation_id, delay=delay)
    except RedisError:
        logger.warning("bulk delivery postponed", extra={"event": "delivery_failed", "bulk_operation": operation_id})
        return False
    return True


def bulk_operation_run_slice(*, operation_id: int, slice_seconds: float = SLICE_SECONDS) -> str:
    """Work on ``operation_id`` for about ``slice_seconds``; return its status afterwards.

    Returns "continue" when more work remains (the caller re-enqueues).
    """
    started = time.monotonic()
    while time.monotonic() - started < slice_seconds:
        operation = BulkOperation.objects.get(pk=operation_id)
        if operation.status != BulkStatus.RUNNING:
            return operation.status
        if operation.processed >= operation.total:
            _finish(operation)
            return BulkStatus.COMPLETED
        index = operation.processed
        # Claim item number `index`: only one job can move `processed` past it.
        claimed = BulkOperation.objects.filter(pk=operation_id, processed=index, status=BulkStatus.RUNNING).update(
            processed=index + 1, updated_at=timezone.now()
        )
        if not claimed:
            continue
        ok = _act_on(operation, operation.item_ids[index])
        BulkOperation.objects.filter(pk=operation_id).update(
            succeeded=F("succeeded") + (1 if ok else 0), failed=F("failed") + (0 if ok else 1)
        )
        if index + 1 == min(operation.canary_size, operation.total):
            if _canary_failed(operation_id):
                return BulkStatus.CANARY_FAILED
        # The rate limit paces items evenly rather than in bursts.
        time.sleep(1.0 / operation.rate_per_second if operation.rate_per_second > 0 else 0)
    return "continue"


def _act_on(operation: BulkOperation, item_id: int) -> bool:
    user = get_user_model().objects.filter(username=operation.requested_by).first()
    if user is None:
        return False
    try:
        dlq_item_act(
            item_id=item_id,
            action=operation.action,
            actor=user,
            reason=BULK_REASON_PREFIX.format(id=operation.pk) + operation.reason,
            client_ip=operation.client_ip,
            resolution_code=operation.resolution_code,
            bulk_operation_id=operation.pk,
        )
    except (ActionRefused, ActionDenied, ReasonRequired):
        return False
    return True


def _canary_failed(operation_id: int) -> bool:
    with transaction.atomic():
        operation = BulkOperation.objects.select_for_update().get(pk=operation_id)
        canary = min(operation.canary_size, operation.total)
        if canary == 0 or operation.failed / canary <= operation.canary_max_failure_rate:
            return False
        operation.status = BulkStatus.CANARY_FAILED
        operation.finished_at = timezone.now()
        operation.save(update_fields=["status", "finished_at", "updated_at"])
        _audit(
            operation,
            "system",
            "bulk_canary_stop",
            BulkStatus.RUNNING,
            operation.status,
            "",
            None,
            detail=AuditDetail(CANARY_FAILED, {"failed": operation.failed, "canary": canary}),
        )
    return True


def _finish(operation: BulkOperation) -> None:
    updated = BulkOperation.objects.filter(pk=operation.pk, status=BulkStatus.RUNNING).update(
        status=BulkStatus.COMPLETED, finished_at=timezone.now(), updated_at=timezone.now()
    )
    if updated:
        _audit(operation, "system", "bulk_complete", BulkStatus.RUNNING, BulkStatus.COMPLETED, "", None)


def _audit(operation, actor, action, before, after, reason, client_ip, refused=False, detail=None) -> None:
    """An entry of ``operation``'s; its detail names the action and the item count unless another is given."""
    audit_record(
        actor=actor,
        action=action,
        target_type="bulk_operation",
        target_id=str(operation.pk),
        state_before=before,
        state_after=after,
        reason=reason or operation.reason,
        outcome=AuditOutcome.REFUSED if refused else AuditOutcome.SUCCEEDED,
        detail=detail or AuditDetail(BULK_ITEMS, {"action": operation.action, "total": operation.total}),
        client_ip=client_ip,
        bulk_operation_id=operation.pk,
    )


def bulk_operations_redeliver_stale() -> int:
    """Re-deliver running operations whose job was lost (called by the sweeper)."""
    stale = BulkOperation.objects.filter(
        status=BulkStatus.RUNNING, updated_at__lt=timezone.now() - timedelta(seconds=STALE_AFTER_SECONDS)
    ).values_list("pk", flat=True)
    count = 0
    for operation_id in stale:
        BulkOperation.objects.filter(pk=operation_id).update(updated_at=timezone.now())
        count += bulk_operation_deliver(operation_id=operation_id)
    return count
