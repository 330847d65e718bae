"""Pause, resume and limit a pipeline at runtime: the services behind the console's pipeline page.

Each is one transaction on the pipeline's ``PipelineControl`` row (created on
first use) and sends ``pipeline_control_changed`` inside it, so the console
audits the change in the same commit. What they hold back is applied by
``tasks.execution.gates`` at claim time and at every step start; a resume or a raised
limit releases held tasks at once, oldest first, as far as the limits allow
(the sweeper goes on with a deep backlog).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from tasks import registry
from tasks.exceptions import ConfigurationError, PipelineControlRefused, UnknownPipeline
from tasks.execution import gates
from tasks.lifecycle.holds import held_tasks_release
from tasks.lifecycle.operator_changes import ChangeKind, change_saved
from tasks.models import PipelineControl, TaskHold
from tasks.pipelines.limits import RateLimit, concurrency_check

# Sent inside the change's transaction: sender=PipelineControl, control=, action=, actor=, reason=, before=, after=,
# client_ip= (the address the change came from, when it came over HTTP).
pipeline_control_changed = Signal()
# Marks an argument a limits change leaves as it is.
UNCHANGED: Any = object()


def pipeline_pause(*, pipeline: str, actor: str, reason: str, client_ip: str | None = None) -> PipelineControl:
    """Pause ``pipeline``: no step of it starts until it is resumed; submissions are still accepted."""
    with transaction.atomic():
        control, before = _locked(pipeline)
        if control.paused:
            raise PipelineControlRefused(
                f"pipeline {pipeline!r} is already paused (by {control.paused_by})",
                code="already_paused",
                details={"pipeline": pipeline, "paused_by": control.paused_by},
            )
        control.paused = True
        control.paused_at = timezone.now()
        control.paused_by = actor[:150]
        change_saved(
            CONTROL_CHANGE,
            control,
            action="pipeline_paused",
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
            reason_field="pause_reason",
        )
    return control


def pipeline_resume(*, pipeline: str, actor: str, reason: str, client_ip: str | None = None) -> PipelineControl:
    """Resume ``pipeline``: its held tasks start again, as far as its limits allow."""
    with transaction.atomic():
        control, before = _locked(pipeline)
        if not control.paused:
            raise PipelineControlRefused(
                f"pipeline {pipeline!r} is not paused", code="not_paused", details={"pipeline": pipeline}
            )
        control.paused = False
        change_saved(
            CONTROL_CHANGE,
            control,
            action="pipeline_resumed",
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
        )
        transaction.on_commit(lambda: _release(pipeline))
    return control


def pipeline_limits_set(
    *,
    pipeline: str,
    actor: str,
    reason: str,
    max_concurrency: Any = UNCHANGED,
    rate_limit: Any = UNCHANGED,
    client_ip: str | None = None,
) -> PipelineControl:
    """Override ``pipeline``'s limits until reset; ``None`` means no limit, ``UNCHANGED`` keeps the current one.

    ``rate_limit`` is a string like ``"10/s"`` (or None); a bad value is a
    ``PipelineControlRefused`` and changes nothing.
    """
    try:
        concurrency = concurrency_check(max_concurrency) if max_concurrency is not UNCHANGED else UNCHANGED
        rate = RateLimit.parse(rate_limit) if rate_limit not in (UNCHANGED, None, "") else rate_limit
    except ConfigurationError as exc:
        raise PipelineControlRefused(str(exc), code="limit_invalid", details={"error": str(exc)}) from None
    if concurrency is UNCHANGED and rate is UNCHANGED:
        raise PipelineControlRefused("give max_concurrency or rate_limit (or both)", code="no_limit_given")
    with transaction.atomic():
        control, before = _locked(pipeline)
        if concurrency is not UNCHANGED:
            control.concurrency_overridden = True
            control.max_concurrency = concurrency
        if rate is not UNCHANGED:
            control.rate_overridden = True
            control.rate_limit = str(rate) if rate else ""
        _limits_stamp(control, actor)
        change_saved(
            CONTROL_CHANGE,
            control,
            action="pipeline_limits_set",
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
        )
        transaction.on_commit(lambda: _release(pipeline))
    return control


def pipeline_limits_reset(*, pipeline: str, actor: str, reason: str, client_ip: str | None = None) -> PipelineControl:
    """Go back to the limits ``pipeline``'s code declares."""
    with transaction.atomic():
        control, before = _locked(pipeline)
        if not (control.concurrency_overridden or control.rate_overridden):
            raise PipelineControlRefused(
                f"pipeline {pipeline!r} runs with the limits its code declares already",
                code="limits_declared_already",
                details={"pipeline": pipeline},
            )
        control.concurrency_overridden = control.rate_overridden = False
        control.max_concurrency, control.rate_limit = None, ""
        _limits_stamp(control, actor)
        change_saved(
            CONTROL_CHANGE,
            control,
            action="pipeline_limits_reset",
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
        )
        transaction.on_commit(lambda: _release(pipeline))
    return control


def _locked(pipeline: str) -> tuple[PipelineControl, dict]:
    try:
        registry.get(pipeline)
    except UnknownPipeline:
        if not PipelineControl.objects.filter(pipeline=pipeline).exists():
            raise PipelineControlRefused(
                f"no pipeline {pipeline!r} is registered", code="unknown_pipeline", details={"pipeline": pipeline}
            ) from None
    PipelineControl.objects.get_or_create(pipeline=pipeline)
    control = PipelineControl.objects.select_for_update().get(pipeline=pipeline)
    return control, _snapshot(control)


def _snapshot(control: PipelineControl) -> dict:
    return {
        "paused": control.paused,
        "max_concurrency": control.max_concurrency if control.concurrency_overridden else "declared",
        "rate_limit": (control.rate_limit or None) if control.rate_overridden else "declared",
    }


def _limits_stamp(control: PipelineControl, actor: str) -> None:
    control.limits_changed_at = timezone.now()
    control.limits_changed_by = actor[:150]


CONTROL_CHANGE = ChangeKind(
    signal=pipeline_control_changed,
    sender=PipelineControl,
    row_argument="control",
    snapshot=_snapshot,
    refusal=PipelineControlRefused,
    log_message="pipeline control changed",
    log_fields=lambda control: {"pipeline": control.pipeline, **_snapshot(control)},
)


def _release(pipeline: str) -> None:
    """After a resume or a limit change: let held tasks start, as many as the gate allows now."""
    gate = gates.gate_of(pipeline=pipeline)
    held_tasks_release(
        pipeline=pipeline,
        holds=[TaskHold.PAUSED, TaskHold.CONCURRENCY],
        limit=gates.releasable(pipeline=pipeline, gate=gate),
    )
    if not gate.paused and gate.rate is None:
        # The rate limit was lifted: tasks waiting for their turn at it need not wait for their scheduled time.
        held_tasks_release(pipeline=pipeline, holds=[TaskHold.RATE], limit=gates.RELEASE_BATCH_SIZE)
