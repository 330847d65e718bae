"""Which attempt the current thread is running, for every log line written meanwhile.

``tasks.execution.attempts.attempt_run`` sets the scope when an attempt starts and resets it when it ends (one
``ContextVar.set`` and ``reset``: a step pays nothing more). Two readers use it:

- ``AttemptFieldsFilter``, on the project's log handler, adds ``task_id``, ``pipeline``, ``step``,
  ``step_index`` and ``attempt`` to every line written in the scope, whoever wrote it: the engine, the step's
  own loggers, ``ctx.log``, the code under ``ctx.http``. ``correlation_fields`` is the one place such fields are made
  (a trace's ``trace_id`` and ``span_id`` belong there);
- ``tasks.observability.attempt_log``'s handler, which keeps the lines a step logged with its attempt.

``task_fields`` makes the same fields from a task row, for the engine's own lines about a task written outside
an attempt's scope (a claim, an outcome, a submission, a signal, a wait): every engine line naming a task
carries ``task_id``, ``pipeline``, ``step`` (the step's name), ``step_index``, ``attempt`` and, with tracing
on, ``trace_id``, passed in ``extra`` so an embedding project's own handler and formatter see them too.

A context variable is per thread (a new thread starts without one), so a line of another thread of the
worker (the heartbeat, a thread the step started) or of another task run on another thread carries
neither the fields nor a place in this attempt's log.
"""

from __future__ import annotations

import logging
import sys
import traceback
from contextvars import ContextVar
from typing import Any


class AttemptScope:
    """The attempt a thread runs: its ids, and (once a line is kept) its log (``tasks.observability.attempt_log``)."""

    __slots__ = (
        "_redactor",
        "attempt",
        "input",
        "kind",
        "log",
        "pipeline",
        "step",
        "step_index",
        "task_id",
        "trace_id",
    )

    def __init__(
        self,
        *,
        task_id: Any,
        pipeline: str,
        step: str,
        attempt: int,
        kind: str,
        step_index: int,
        input: Any = None,
    ) -> None:
        self.task_id = str(task_id)
        self.pipeline = pipeline
        self.step = step
        self.step_index = step_index
        self.attempt = attempt
        # The attempt's trace, for a line written where no span is current (the interrupt's, on another thread).
        self.trace_id = ""
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
    and current span too (``tasks.observability.tracing``), so a log shipper joins the line to its span."""
    fields: dict[str, Any] = {
        "task_id": scope.task_id,
        "pipeline": scope.pipeline,
        "step": scope.step,
        "step_index": scope.step_index,
        "attempt": scope.attempt,
    }
    fields.update(_trace_ids(scope))
    return fields


def _trace_ids(holder: Any) -> dict[str, str]:
    """With tracing on, the current span's ``trace_id`` and ``span_id``, or where no span is current the
    ``trace_id`` of ``holder`` (a task, an attempt's scope: the task's own trace, "" when it has none, read only
    then); nothing with tracing off."""
    tracer = _tracer()
    if tracer is None:
        return {}
    if ids := tracer.log_ids():
        return ids
    return {"trace_id": holder.trace_id} if holder.trace_id else {}


def current_trace_id() -> str:
    """With tracing on, the id of the current span's trace; "" otherwise."""
    tracer = _tracer()
    return "" if tracer is None else tracer.log_ids().get("trace_id", "")


def _tracer() -> Any:
    """``tasks.observability.tracing.active``: a dict lookup and a module global read. Not imported here (the
    logging configuration imports this module before the settings are read): a process whose tracing module is
    not even loaded has tracing off."""
    tracing = sys.modules.get("tasks.observability.tracing")
    return None if tracing is None else tracing.active


def attempt_fields() -> dict[str, Any]:
    """The fields of the attempt this thread runs (``correlation_fields``); empty outside one."""
    scope = current_attempt.get()
    return correlation_fields(scope) if scope is not None else {}


def task_fields(
    task: Any, *, step_index: int | None = None, step: str | None = None, attempt: int | None = None
) -> dict[str, Any]:
    """The fields an engine line about ``task`` (a ``Task`` row as read) carries in ``extra``: its id, pipeline,
    the step's name and index (the task's current step unless ``step_index`` says which, its recorded name unless
    ``step`` says), the attempt (the step's count unless ``attempt`` says), and with tracing on the ids of the
    current span, or the task's own trace where no span is current (a claim, before its run's span starts).
    No query: what the row holds."""
    index = task.current_step if step_index is None else step_index
    fields: dict[str, Any] = {
        "task_id": str(task.pk),
        "pipeline": task.pipeline,
        "step": task.step_name_at(index) if step is None else step,
        "step_index": index,
        "attempt": task.step_attempt if attempt is None else attempt,
    }
    fields.update(_trace_ids(task))
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
