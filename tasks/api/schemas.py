"""The API's request and response shapes (they are the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, field_validator, model_validator

from tasks.submission.batches import MAX_BATCH_ITEMS
from tasks.submission.submit import MAX_DEADLINE_SECONDS, MAX_START_DELAY_SECONDS

TaskStateName = Literal[
    "queued",
    "running",
    "retry_scheduled",
    "waiting",
    "succeeded",
    "failed",
    "compensating",
    "compensated",
    "compensation_failed",
    "cancelled",
]
StepStateName = Literal["pending", "running", "retry_scheduled", "succeeded", "failed", "compensated", "cancelled"]


class TaskCreateIn(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")

    pipeline: str = Field(min_length=1, max_length=100, description="a registered pipeline name")
    input: dict[str, Any] = Field(description="the pipeline's input object")
    deadline_seconds: float | None = Field(
        None, gt=0, le=MAX_DEADLINE_SECONDS, description="overall deadline, in seconds from now"
    )
    callback_url: str | None = Field(
        None,
        description="POSTed the task's terminal state, signed with the client's secret (the docs' Submit tasks "
        "and the HTTP API); its host must be allowed by the server",
    )
    # An RFC 3339 string in the JSON body: the only field parsed from text, hence not strict.
    run_at: datetime | None = Field(
        None,
        strict=False,
        description="start no earlier than this time (RFC 3339, with its offset); the task waits until then "
        "(state waiting) without a worker. Not with delay_seconds",
    )
    delay_seconds: float | None = Field(
        None, ge=0, le=MAX_START_DELAY_SECONDS, description="start this many seconds from now; not with run_at"
    )

    @field_validator("run_at", mode="before")
    @classmethod
    def _rfc_3339(cls, value):
        # Not strict, pydantic would also take a number as seconds since 1970.
        if value is not None and not isinstance(value, str):
            raise ValueError("run_at is an RFC 3339 time, e.g. 2030-01-01T03:00:00+01:00")
        return value

    @model_validator(mode="after")
    def _one_start(self):
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self


class TaskBatchItemIn(TaskCreateIn):
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=r"^[\x20-\x7E]{1,255}$",
        description="as the Idempotency-Key header of a single submission, for this item alone",
    )


class TaskBatchIn(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")

    items: list[TaskBatchItemIn] = Field(min_length=1, max_length=MAX_BATCH_ITEMS, description="the tasks, in order")
    atomic: bool = Field(False, description="true: one bad item refuses the whole batch (a 422) and stores nothing")


class CancelIn(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")

    reason: str | None = Field(None, max_length=1000, description="why; kept with the task and in the audit log")


class WaitingOut(Schema):
    for_: Literal["start", "time", "signal"] = Field(
        alias="for",
        description="what the task waits for: start, its start time; time, the end of a sleep step; signal, the "
        "signal its wait step names",
    )
    name: str | None = Field(description="the signal's, or the sleep step's, name (none for a start)")
    until: datetime | None = Field(
        description="when it stops waiting: its start, the end of its sleep, or the wait's timeout"
    )


class SignalIn(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")

    payload: Any = Field(None, description="any JSON, at most 64 KB: the wait step's checkpoint, ctx.outputs[name]")


class SignalOut(Schema):
    task_id: str
    name: str = Field(description="the signal's name, the wait step's")
    received_at: datetime = Field(description="when it was first received (a repeat answers the first again)")


class CancelOut(Schema):
    requested_at: datetime
    reason: str


class LogLineOut(Schema):
    at: str = Field(description="when the line was logged (ISO 8601, UTC)")
    level: str = Field(description="its level: INFO, WARNING, ERROR, CRITICAL (or DEBUG when kept)")
    logger: str = Field(description="the logger's name; `reliability.step` for `ctx.log`")
    message: str = Field(description="the message (with its traceback, if any), secrets redacted")


class AttemptLogOut(Schema):
    kind: str = Field(description="`step` or `compensation`")
    attempt: int
    outcome: str
    started_at: datetime | None
    finished_at: datetime | None
    log: list[LogLineOut] = Field(description="what the step logged during the attempt: its first lines")
    log_dropped: int = Field(description="lines logged past the attempt's log limits, counted, not kept")


class StepOut(Schema):
    name: str
    state: StepStateName
    attempts: int
    last_error_code: str | None
    last_error_message: str | None
    attempt_logs: list[AttemptLogOut] | None = Field(
        description="each attempt of the step (and of its compensation) with what it logged, oldest first, "
        "with `logs=true`; null without it (and in a completion callback's body, the same JSON)"
    )


class FailureOut(Schema):
    reason: str
    code: str
    message: str
    step: str | None


class TaskOut(Schema):
    id: str
    pipeline: str
    state: TaskStateName
    current_step: str | None
    steps: list[StepOut]
    result: Any = Field(description="the last step's output, once succeeded")
    failure: FailureOut | None
    cancel: CancelOut | None = Field(description="set once a cancel was requested")
    waiting: WaitingOut | None = Field(description="set while the task waits (state waiting)")
    attributes: dict[str, str] = Field(description="its search attributes (the pipeline's declared business keys)")
    trace_id: str | None = Field(description="the OpenTelemetry trace its submission and runs belong to (tracing on)")
    deadline: datetime | None
    created_at: datetime
    updated_at: datetime


class TaskSummaryOut(Schema):
    id: str
    pipeline: str
    state: TaskStateName
    current_step: str | None
    failure: FailureOut | None
    cancel: CancelOut | None
    waiting: WaitingOut | None
    attributes: dict[str, str]
    trace_id: str | None
    deadline: datetime | None
    created_at: datetime
    updated_at: datetime


class TaskPageOut(Schema):
    items: list[TaskSummaryOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


class IdempotencyRecordOut(Schema):
    key: str
    task_id: str | None
    request_fingerprint: str
    first_response_status: int | None
    state: Literal["in_progress", "completed"]
    created_at: datetime
    expires_at: datetime
    replays: int


class ErrorBody(Schema):
    code: str
    message: str
    details: Any = None


class ErrorOut(Schema):
    error: ErrorBody


class BatchItemOut(Schema):
    index: int = Field(description="the item's place in the request")
    status: int = Field(description="what a single submission of the item would have answered: 201, or an error's")
    replayed: bool = Field(description="the item's key named an earlier task: that task's first answer")
    task: TaskOut | None
    error: ErrorBody | None


class TaskBatchOut(Schema):
    items: list[BatchItemOut]
