"""The engine's durable state, one module per concept; import models from here."""

from tasks.models.dead_letter import UNRESOLVED_STATUSES, DeadLetter, DLQStatus, ResolutionCode
from tasks.models.retention import RetentionPurge
from tasks.models.steps import AttemptKind, AttemptOutcome, Checkpoint, EffectStatus, SideEffect, StepAttempt
from tasks.models.submission import ApiClient, IdempotencyRecord, IdempotencyState
from tasks.models.sweeper import SweeperHeartbeat
from tasks.models.task import LEASED_STATES, TERMINAL_STATES, FailureReason, Task, TaskState, lease_expiry

__all__ = [
    "LEASED_STATES",
    "TERMINAL_STATES",
    "UNRESOLVED_STATUSES",
    "ApiClient",
    "AttemptKind",
    "AttemptOutcome",
    "Checkpoint",
    "DLQStatus",
    "DeadLetter",
    "EffectStatus",
    "FailureReason",
    "IdempotencyRecord",
    "IdempotencyState",
    "ResolutionCode",
    "RetentionPurge",
    "SideEffect",
    "StepAttempt",
    "SweeperHeartbeat",
    "Task",
    "TaskState",
    "lease_expiry",
]
