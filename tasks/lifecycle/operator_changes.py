"""An operator's audited change to a row that steers work: a pipeline's controls, a schedule.

Every such change ends the same way, inside the caller's transaction: the reason checked and stripped (a
missing or too long one refuses the change, nothing is kept), the row saved, the kind's signal sent with the
row's state before and after (``dlq.control_audit`` writes the audit entry in the same commit) and one log line.
``change_saved`` is that ending; ``tasks.lifecycle.controls`` and ``tasks.lifecycle.schedules`` say what differs
(their signal, their snapshot, their refusal) in a ``ChangeKind``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.dispatch import Signal

from tasks.exceptions import ReliabilityError

logger = logging.getLogger(__name__)

REASON_MAX_LENGTH = 1000


@dataclass(frozen=True)
class ChangeKind:
    """What one kind of audited change sends and says."""

    signal: Signal
    sender: type[models.Model]
    row_argument: str  # the signal's argument that carries the row ("control", "schedule")
    snapshot: Callable[[Any], dict]  # what the audit entry records of the row before and after
    refusal: type[ReliabilityError]  # raised for a reason that is missing or too long
    log_message: str
    log_fields: Callable[[Any], dict]  # the fields of the log line: the row's name and what may be logged of it


def operator_reason(reason: str, refusal: type[ReliabilityError]) -> str:
    """The reason of an operator's audited change, stripped; ``refusal`` (its code ``reason_required`` or
    ``reason_too_long``) when it is empty or too long."""
    reason = (reason or "").strip()
    if not reason:
        raise refusal("a reason is required", code="reason_required")
    if len(reason) > REASON_MAX_LENGTH:
        raise refusal(
            f"a reason is at most {REASON_MAX_LENGTH} characters",
            code="reason_too_long",
            details={"max": REASON_MAX_LENGTH},
        )
    return reason


def change_saved(
    kind: ChangeKind,
    row: models.Model,
    *,
    action: str,
    actor: str,
    reason: str,
    before: dict,
    client_ip: str | None,
    reason_field: str | None = None,
) -> None:
    """Check ``reason``, save ``row`` (its ``reason_field`` set to the checked reason), send ``kind``'s signal and
    log the change; inside the caller's transaction, so a refused reason or a failed save keeps nothing."""
    reason = operator_reason(reason, kind.refusal)
    if reason_field is not None:
        setattr(row, reason_field, reason)
    row.save()
    after = kind.snapshot(row)
    kind.signal.send(
        sender=kind.sender,
        **{kind.row_argument: row},
        action=action,
        actor=actor,
        reason=reason,
        before=before,
        after=after,
        client_ip=client_ip,
    )
    logger.info(kind.log_message, extra={"event": action, **kind.log_fields(row), "by": actor})
