"""Each attempt's own log: the lines a step logged while it ran, kept with its attempt row.

One handler per process (``AttemptLogHandler``, on the root logger, put there by ``capture_installed``
when an attempt starts) sees every record any logger lets through. It keeps a record only when the
thread that wrote it is inside an attempt (``tasks.observability.log_fields.current_attempt``), so lines of other
threads (the heartbeat, another task's thread) never land in this attempt's log, and a record outside
an attempt costs one context-variable read. What is kept:

- records of INFO and above (``RELIABILITY_ATTEMPT_LOG_LEVEL``), from any logger but the engine's own
  (``tasks.…``, ``dlq.…``, ``reliability_console.…``: those are about the engine, and go to the process's
  log with the attempt's fields); ``ctx.log`` writes to ``STEP_LOGGER``, which is the step's;
- the first ``RELIABILITY_ATTEMPT_LOG_LINES`` lines and ``RELIABILITY_ATTEMPT_LOG_BYTES`` bytes of message
  text (a line that does not fit is cut to what is left); every later line is only counted. A step that
  logs 10,000 lines keeps its speed: past the cap a line costs a comparison and an addition here;
- never anything that blocks or raises into the step: the handler takes no lock (its buffer belongs to
  one thread) and a record it cannot read is counted as not kept.

The lines are redacted and written with the attempt row, in the same statement (``tasks.execution.attempts``).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime

from tasks.conf import engine_settings
from tasks.observability.log_fields import current_attempt

# The logger behind ctx.log. Not under "tasks.": its lines are the step's, and kept.
STEP_LOGGER = "reliability.step"
# Loggers of the engine and the console: their lines are about the engine, not what the step said.
ENGINE_LOGGERS = ("tasks.", "dlq.", "reliability_console.")
ENGINE_LOGGER_NAMES = frozenset({"tasks", "dlq", "reliability_console"})
CUT_MARK = " [cut]"


@dataclass(frozen=True)
class LogLine:
    """One kept line: when, how severe, which logger, what it said (not yet redacted)."""

    created: float
    level: str
    logger: str
    message: str

    def as_json(self) -> dict[str, str]:
        at = datetime.fromtimestamp(self.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {"at": at, "level": self.level, "logger": self.logger, "message": self.message}


class AttemptLog:
    """The lines one attempt kept, within its line and byte limits, and how many it did not keep."""

    __slots__ = ("dropped", "level", "lines", "max_bytes", "max_lines", "size")

    def __init__(self, *, max_lines: int, max_bytes: int, level: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.level = level
        self.lines: list[LogLine] = []
        self.size = 0
        self.dropped = 0

    @classmethod
    def from_settings(cls) -> AttemptLog:
        level = logging.getLevelName(engine_settings.ATTEMPT_LOG_LEVEL)
        return cls(
            max_lines=engine_settings.ATTEMPT_LOG_LINES,
            max_bytes=engine_settings.ATTEMPT_LOG_BYTES,
            level=level if isinstance(level, int) else logging.INFO,
        )

    @property
    def full(self) -> bool:
        return len(self.lines) >= self.max_lines or self.size >= self.max_bytes

    def keep(self, record: logging.LogRecord) -> None:
        if self.full:
            self.dropped += 1
            return
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        size = len(message) if message.isascii() else len(message.encode())
        room = self.max_bytes - self.size
        if size > room:
            # The first line past the limit keeps what fits, so a single huge line still says something.
            message = message.encode()[: max(0, room - len(CUT_MARK))].decode(errors="ignore") + CUT_MARK
            size = room
        self.lines.append(LogLine(record.created, record.levelname, record.name, message))
        self.size += size


class AttemptLogHandler(logging.Handler):
    """Keeps a record in the log of the attempt its thread is running (``AttemptLog``), if any."""

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: the buffer is the writing thread's own, and a step must never wait for another's.
        scope = current_attempt.get()
        if scope is None:
            return False
        try:
            name = record.name
            if name.startswith(ENGINE_LOGGERS) or name in ENGINE_LOGGER_NAMES:
                return False
            log = scope.log
            if log is None:
                log = scope.log = AttemptLog.from_settings()
            if record.levelno < log.level or log.max_lines <= 0:
                return False
            log.keep(record)
        except Exception:
            # A record that cannot be read (a broken %-format, a failing __str__) is not kept, only counted:
            # the step that logged it goes on as if nothing happened.
            if scope.log is not None:
                scope.log.dropped += 1
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


_handler = AttemptLogHandler()


def capture_installed() -> None:
    """Put the capture handler on the root logger if it is not there (once per process, or again after a
    project's logging configuration replaced the root's handlers)."""
    root = logging.getLogger()
    if _handler not in root.handlers:
        root.addHandler(_handler)


def step_logger() -> logging.Logger:
    """``ctx.log``: a logger whose lines are the step's (kept with its attempt, and written out like any other)."""
    return logging.getLogger(STEP_LOGGER)
