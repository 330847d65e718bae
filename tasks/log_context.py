"""Which attempt the current thread is running, for every log line written meanwhile.

``tasks.attempts.attempt_run`` sets the scope when an attempt starts and resets it when it ends (one
``ContextVar.set`` and ``reset``: a step pays nothing more). Two readers use it:

- ``AttemptFieldsFilter``, on the project's log handler, adds ``task_id``, ``pipeline``, ``step`` and
  ``attempt`` to every line written in the scope, whoever wrote it: the engine, the step's own loggers,
  ``ctx.log``, the code under ``ctx.http``. ``correlation_fields`` is the one place such fields are made
  (a trace's ``trace_id`` and ``span_id`` belong there);
- ``tasks.attempt_log``'s handler, which keeps the lines a step logged with its attempt.

A context variable is per thread (a new thread starts without one), so a line of another thread of the
worker (the heartbeat, a thread the step started) or of another task run on another thread carries
neither the fields nor a place in this attempt's log.
"""

from __future__ import annotations

import logging
import traceback
from contextvars import ContextVar
from typing import Any


class AttemptScope:
    """The attempt a thread runs: its ids, and (once a line is kept) its log (``tasks.attempt_log``)."""

    __slots__ = ("_redactor", "attempt", "input", "kind", "log", "pipeline", "step", "task_id")

    def __init__(self, *, task_id: Any, pipeline: str, step: str, attempt: int, kind: str, input: Any = None) -> None:
        self.task_id = str(task_id)
        self.pipeline = pipeline
        self.step = step
        self.attempt = attempt
        self.kind = kind
        self.input = input  # the task's input: its secrets are redacted from the lines written out
        # Made by the capture handler on the attempt's first kept line: an attempt that logs nothing makes none.
        self.log = None
        self._redactor = None

    def redacted(self, text: str) -> str:
        """``text`` without the task's secrets (``tasks.redaction``: the rules and the input's own secrets)."""
        if self._redactor is None:
            from tasks.redaction import TaskRedactor  # on the first line written out: a quiet step builds none

            self._redactor = TaskRedactor(self.input)
        return self._redactor.text(text)


current_attempt: ContextVar[AttemptScope | None] = ContextVar("reliability_current_attempt", default=None)


def correlation_fields(scope: AttemptScope) -> dict[str, Any]:
    """The fields every line written inside ``scope`` carries; with tracing on, the ids of the attempt's trace
    and current span too (``tasks.tracing``), so a log shipper joins the line to its span."""
    fields = {"task_id": scope.task_id, "pipeline": scope.pipeline, "step": scope.step, "attempt": scope.attempt}
    from tasks import tracing  # a module global read; OpenTelemetry itself only when tracing is on

    if tracing.active is not None:
        fields.update(tracing.active.log_ids())
    return fields


class AttemptFieldsFilter(logging.Filter):
    """Adds the current attempt's fields to a record (never replacing a field the line gave itself), and takes
    the task's secrets out of its message and traceback: a step that logs its API key by mistake writes
    ``[redacted]`` to the process's log too, as to its attempt's stored log.

    Put it on the handlers that write lines out (the standalone project's console handler has it), so
    every formatter sees the fields as if they had been passed in ``extra``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_attempt.get()
        if scope is not None:
            fields = vars(record)
            for name, value in correlation_fields(scope).items():
                fields.setdefault(name, value)
            try:
                message = record.getMessage()
                redacted = scope.redacted(message)
                if redacted != message:
                    record.msg, record.args = redacted, ()
                if record.exc_info and not record.exc_text:
                    record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
                if record.exc_text:
                    record.exc_text = scope.redacted(record.exc_text)
            except Exception:  # a record whose message cannot be made: the formatter reports it as it would
                pass
        return True
