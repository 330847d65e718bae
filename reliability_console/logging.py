"""A log formatter for structured events: ``event=task_claimed task_id=… step=…``."""

from __future__ import annotations

import logging

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
