"""The project's log formatters for structured events: ``event=task_claimed task_id=… step=…`` (the default), or
one JSON object per line (``RELIABILITY_LOG_FORMAT=json``, for log shippers).

Both write the same fields: what a line passed in ``extra`` (every engine line about a task passes its
``task_id``, ``pipeline``, ``step`` name, ``step_index``, ``attempt`` and, with tracing on, ``trace_id``:
``tasks.observability.log_fields.task_fields``) and, inside a step's attempt, the attempt's fields on every other
line too (``tasks.observability.log_fields.AttemptFieldsFilter`` adds them on the handler). Both take the
credentials out of every URL's query string.
"""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from tasks.redaction import query_strings_redacted

# Attributes every LogRecord has; anything else was passed through ``extra``.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class StructuredFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # Any URL's query string loses its credentials, whoever logged it: django.request passes the request,
        # whose repr holds the full path (a token sent as ?token=… is refused, then was written down whole).
        base = query_strings_redacted(super().format(record))
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}
        if not fields:
            return base
        return base + " " + " ".join(f"{key}={_quote(value)}" for key, value in sorted(fields.items()))


def _quote(value: object) -> str:
    text = query_strings_redacted(str(value))
    if not text or any(ch.isspace() or ch in '"=' for ch in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class JsonLinesFormatter(JsonFormatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and every field."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "traceback"},
            timestamp="time",
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        # As the text formatter: no URL's credentials, whoever logged it (django.request passes the request).
        return {
            key: query_strings_redacted(value) if isinstance(value, str) else value for key, value in log_data.items()
        }
