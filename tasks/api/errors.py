"""API errors: always ``{"error": {"code", "message", "details"}}`` with a fitting status."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse


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
