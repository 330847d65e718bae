"""API errors: always ``{"error": {"code", "message", "details"}}`` with a fitting status."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse

from tasks.exceptions import (
    BatchRefused,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidTaskInput,
    ReliabilityError,
    SignalAlreadyReceived,
    TaskFinished,
    TaskNotActionable,
    TaskNotCancellable,
    UnknownPipeline,
    UnknownSignal,
)


class ApiError(Exception):
    """An error the API answers with ``status`` and a stable ``code``."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


def error_response(status: int, code: str, message: str, details: Any = None) -> HttpResponse:
    body = {"error": {"code": code, "message": message, "details": details}}
    return HttpResponse(json_bytes(body), status=status, content_type="application/json")


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":")).encode()


ENGINE_ERRORS: dict[type[ReliabilityError], tuple[int, str]] = {
    UnknownPipeline: (422, "unknown_pipeline"),
    InvalidTaskInput: (400, "validation_error"),
    IdempotencyKeyReused: (422, "idempotency_key_reused"),
    IdempotencyKeyInUse: (409, "idempotency_key_in_use"),
    TaskNotCancellable: (409, "task_not_cancellable"),
    TaskNotActionable: (404, "not_found"),
    BatchRefused: (422, "batch_refused"),
    UnknownSignal: (422, "unknown_signal"),
    SignalAlreadyReceived: (409, "signal_already_received"),
    TaskFinished: (409, "task_finished"),
}


def engine_error_status(exc: ReliabilityError) -> tuple[int, str]:
    """The status and code the API answers an engine error with ((500, "internal_error") for any other)."""
    for error_type, status_code in ENGINE_ERRORS.items():
        if isinstance(exc, error_type):
            return status_code
    return 500, "internal_error"
