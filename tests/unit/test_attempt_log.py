"""Each attempt's own log and the attempt's fields on every line (issue 24, points 2 and 3), without a database.

``attempt_run`` is called as the runner calls it; the records the process's log handler would write are
caught by a handler of the test's own, with the project's filter on it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import pytest
from django.test import override_settings

from reliability_console.logging import JsonLinesFormatter, StructuredFormatter
from tasks.execution.attempts import attempt_run
from tasks.execution.context import StepContext
from tasks.models import Task
from tasks.observability.attempt_log import CUT_MARK, STEP_LOGGER, AttemptLogHandler
from tasks.observability.log_fields import AttemptFieldsFilter

step_log = logging.getLogger("shop.steps")
FIELDS = ("task_id", "pipeline", "step", "attempt")


class Caught(logging.Handler):
    """What the process's log would write: every record, through the project's fields filter."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(AttemptFieldsFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def caught():
    handler = Caught()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def capture_handler() -> AttemptLogHandler:
    return next(h for h in logging.getLogger().handlers if isinstance(h, AttemptLogHandler))


def context(*, step: str = "charge", attempt: int = 1, task_id=None) -> StepContext:
    return StepContext(
        task_id=task_id or uuid.uuid4(),
        pipeline="shop",
        step=step,
        input={},
        outputs={},
        deadline=None,
        call_deadline=time.time() + 30,
        attempt=attempt,
        generation=0,
    )


def run(function, ctx: StepContext | None = None):
    return attempt_run(function, ctx or context(), kind="step", step_index=0, worker="w1", timeout=30).record


def test_a_steps_lines_and_ctx_log_are_kept_with_the_attempt_and_the_engines_are_not():
    def step(ctx):
        step_log.info("charging %s", "alice")
        ctx.log.warning("slow answer")
        ctx.log.debug("below the kept level")
        logging.getLogger("tasks.execution.runner").info("the engine's own line")
        logging.getLogger("dlq.alerting").info("the console's own line")

    record = run(step)
    assert [(line.level, line.logger, line.message) for line in record.log] == [
        ("INFO", "shop.steps", "charging alice"),
        ("WARNING", STEP_LOGGER, "slow answer"),
    ]
    assert record.log_dropped == 0


def test_every_line_inside_the_attempt_carries_its_fields_and_none_outside(caught):
    ctx = context(step="charge", attempt=3)

    def step(ctx):
        step_log.info("from the step")
        logging.getLogger("tasks.outbound.http").info("from the engine, under ctx.http")
        step_log.info("with its own step", extra={"step": "given"})

    run(step, ctx)
    step_log.info("after the attempt")
    inside = [r for r in caught.records if r.getMessage() != "after the attempt"]
    assert len(inside) == 3
    for record in inside:
        assert record.task_id == str(ctx.task_id) and record.pipeline == "shop" and record.attempt == 3
    assert [r.step for r in inside] == ["charge", "charge", "given"]  # a field the line gave itself is kept
    after = next(r for r in caught.records if r.getMessage() == "after the attempt")
    assert not any(hasattr(after, name) for name in FIELDS)


def test_ten_thousand_lines_keep_the_first_200_and_count_the_rest():
    def step(ctx):
        for number in range(10_000):
            step_log.info("line %d", number)

    record = run(step)
    assert len(record.log) == 200 and record.log_dropped == 9_800
    assert record.log[0].message == "line 0" and record.log[-1].message == "line 199"


@override_settings(RELIABILITY_ATTEMPT_LOG_BYTES=1024)
def test_the_byte_limit_cuts_the_line_that_passes_it_and_counts_the_rest():
    def step(ctx):
        step_log.info("x" * 600)
        step_log.info("é" * 600)  # 1,200 bytes: cut to what is left
        step_log.info("short")

    record = run(step)
    assert len(record.log) == 2 and record.log_dropped == 1
    assert record.log[1].message.endswith(CUT_MARK)
    assert sum(len(line.message.encode()) for line in record.log) <= 1024


@override_settings(RELIABILITY_ATTEMPT_LOG_LINES=0)
def test_no_line_is_kept_when_the_limit_is_zero():
    record = run(lambda ctx: step_log.info("not kept"))
    assert record.log == () and record.log_dropped == 0


@override_settings(RELIABILITY_ATTEMPT_LOG_LEVEL="DEBUG")
def test_the_kept_level_is_a_setting(caught):
    logging.getLogger().setLevel(logging.DEBUG)
    record = run(lambda ctx: ctx.log.debug("details"))
    assert [line.message for line in record.log] == ["details"]


def test_a_record_that_cannot_be_formatted_never_reaches_the_step():
    # Handed to the capture handler alone: pytest's own log handler fails a test on such a record.
    broken = step_log.makeRecord("shop.steps", logging.INFO, __file__, 1, "%d items", ("many",), None)

    def step(ctx):
        capture_handler().handle(broken)
        step_log.info("still here")
        return "done"

    result = attempt_run(step, context(), kind="step", step_index=0, worker="w1", timeout=30)
    assert result.value == "done" and result.record.outcome == "succeeded"
    assert [line.message for line in result.record.log] == ["still here"] and result.record.log_dropped == 1


def test_an_exceptions_traceback_is_part_of_its_line():
    def step(ctx):
        try:
            raise ValueError("bad value")
        except ValueError:
            step_log.exception("could not parse")
        raise RuntimeError("failed")

    record = run(step)
    assert record.outcome == "permanent_error"
    assert (
        record.log[0].message.startswith("could not parse\nTraceback")
        and "ValueError: bad value" in record.log[0].message
    )


def test_lines_of_another_thread_are_not_the_attempts(caught):
    def elsewhere():
        step_log.info("from a thread the step started")

    def step(ctx):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        step_log.info("from the step")

    record = run(step)
    assert [line.message for line in record.log] == ["from the step"]
    other = next(r for r in caught.records if r.getMessage() == "from a thread the step started")
    assert not hasattr(other, "task_id")


def test_two_attempts_on_two_threads_keep_only_their_own_lines(caught):
    both_logging = threading.Barrier(2, timeout=10)
    records = {}

    def attempt(label: str) -> None:
        def step(ctx):
            for number in range(50):
                step_log.info("%s %d", label, number)
                if number == 10:
                    both_logging.wait()  # each is inside its attempt, logging, while the other is
            ctx.log.info("%s done", label)

        records[label] = run(step, context(step=label))

    threads = [threading.Thread(target=attempt, args=(label,)) for label in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    for label in ("left", "right"):
        messages = [line.message for line in records[label].log]
        assert len(messages) == 51 and all(message.startswith(label) for message in messages)
        written = [r for r in caught.records if r.getMessage().startswith(label)]
        assert {r.step for r in written} == {label}


def test_the_stored_lines_are_redacted_with_the_tasks_own_secrets():
    task = Task(pk=uuid.uuid4(), pipeline="shop", input={"api_key": "k_9f8e7d6c5b4a3928"}, generation=0)

    def step(ctx):
        ctx.log.info("calling with key k_9f8e7d6c5b4a3928")
        step_log.info("header Authorization: Bearer sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc")

    values = run(step, context(task_id=task.pk)).values(task)
    assert [line["message"] for line in values["log"]] == [
        "calling with key [redacted]",
        "header Authorization: [redacted]",
    ]
    assert values["log"][0]["at"].endswith("Z") and values["log"][0]["level"] == "INFO"
    assert values["log_dropped"] == 0


def test_an_attempt_that_logged_nothing_stores_null():
    task = Task(pk=uuid.uuid4(), pipeline="shop", input={}, generation=0)
    values = run(lambda ctx: None, context(task_id=task.pk)).values(task)
    assert values["log"] is None and values["log_dropped"] == 0


def test_both_formats_write_the_attempts_fields(caught):
    run(lambda ctx: step_log.info("charged %s", "alice", extra={"event": "charged"}), context(attempt=2))
    record = next(r for r in caught.records if r.getMessage() == "charged alice")
    text = StructuredFormatter().format(record)
    assert "INFO shop.steps charged alice " in text
    assert "attempt=2 event=charged pipeline=shop step=charge step_index=0 task_id=" in text
    line = json.loads(JsonLinesFormatter().format(record))
    keys = ("level", "logger", "message", "event", "pipeline", "step", "step_index", "attempt")
    assert {key: line[key] for key in keys} == {
        "level": "INFO",
        "logger": "shop.steps",
        "message": "charged alice",
        "event": "charged",
        "pipeline": "shop",
        "step": "charge",
        "step_index": 0,
        "attempt": 2,
    }
    assert line["task_id"] == record.task_id and line["time"].startswith("20")


def test_the_json_formatter_takes_credentials_out_of_query_strings():
    record = logging.makeLogRecord(
        {"name": "django.request", "levelno": 30, "levelname": "WARNING", "msg": "GET /api/v1/tasks?token=rc_abc123"}
    )
    line = json.loads(JsonLinesFormatter().format(record))
    assert "rc_abc123" not in json.dumps(line) and "token=" in line["message"]
