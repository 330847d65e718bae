"""The engine's durable state, one module per concept; import models from here."""

from tasks.models.dead_letter import UNRESOLVED_STATUSES, DeadLetter, DLQStatus, ResolutionCode, resolution_label
from tasks.models.pipeline_control import ConcurrencySlot, PipelineControl, RatePermit
from tasks.models.retention import RetentionPurge
from tasks.models.schedules import PipelineSchedule, ScheduleRun, ScheduleSource
from tasks.models.signals import Signal
from tasks.models.steps import AttemptKind, AttemptOutcome, Checkpoint, EffectStatus, SideEffect, StepAttempt
from tasks.models.submission import ApiClient, IdempotencyRecord, IdempotencyState
from tasks.models.sweeper import SweeperHeartbeat
from tasks.models.task import (
    CANCELLABLE_STATES,
    LEASED_STATES,
    TERMINAL_STATES,
    FailureReason,
    Task,
    TaskHold,
    TaskState,
    WaitKind,
    lease_expiry,
)

__all__ = [
    "CANCELLABLE_STATES",
    "LEASED_STATES",
    "TERMINAL_STATES",
    "UNRESOLVED_STATUSES",
    "ApiClient",
    "AttemptKind",
    "AttemptOutcome",
    "Checkpoint",
    "ConcurrencySlot",
    "DLQStatus",
    "DeadLetter",
    "EffectStatus",
    "FailureReason",
    "IdempotencyRecord",
    "IdempotencyState",
    "PipelineControl",
    "PipelineSchedule",
    "RatePermit",
    "ResolutionCode",
    "RetentionPurge",
    "ScheduleRun",
    "ScheduleSource",
    "SideEffect",
    "Signal",
    "StepAttempt",
    "SweeperHeartbeat",
    "Task",
    "TaskHold",
    "TaskState",
    "WaitKind",
    "lease_expiry",
    "resolution_label",
]
