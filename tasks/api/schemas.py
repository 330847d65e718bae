"""The API's request and response shapes (they are the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from tasks.submission import MAX_DEADLINE_SECONDS

TaskStateName = Literal[
    "queued",
    "running",
    "retry_scheduled",
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


class CancelIn(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")

    reason: str | None = Field(None, max_length=1000, description="why; kept with the task and in the audit log")


class CancelOut(Schema):
    requested_at: datetime
    reason: str


class StepOut(Schema):
    name: str
    state: StepStateName
    attempts: int
    last_error_code: str | None
    last_error_message: str | None


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
