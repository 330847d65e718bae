"""What an attempt's log costs a step (issue 24, point 3): a step logging 10,000 lines, and a step logging none.

In one process with the standalone project's logging (its console handler writing to a file, as a worker's
standard error would), the same step function runs through ``tasks.execution.attempts.attempt_run``:

- with the capture (the default: 200 lines and 64 KB kept, the rest counted);
- without it: the capture handler taken off the root logger, so every record goes only to the console handler.

Each variant runs ``--rounds`` times, alternately; the medians are printed. A step that logs nothing is timed
the same way (``attempt_run`` of a no-op, with and without the attempt's scope), for the per-step cost. No
database is needed: ``attempt_run`` writes nothing. Run: ``.venv/bin/python scripts/bench_attempt_log.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    os.environ["RELIABILITY_LOG_FORMAT"] = args.format
    import django

    django.setup()
    from tasks.execution.attempts import attempt_run
    from tasks.execution.context import StepContext
    from tasks.observability import attempt_log, log_fields

    # The worker's log goes to a file here, not to this terminal.
    sink = tempfile.TemporaryFile("w")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)
    step_log = logging.getLogger("bench.steps")

    def loud(ctx):
        for number in range(args.lines):
            step_log.info("line %d of the step", number)

    def quiet(ctx):
        return None

    def once(function) -> tuple[float, object]:
        ctx = StepContext(
            task_id=uuid.uuid4(),
            pipeline="bench",
            step="loud",
            input={},
            outputs={},
            deadline=None,
            call_deadline=time.time() + 600,
            attempt=1,
            generation=0,
        )
        started = time.perf_counter()
        result = attempt_run(function, ctx, kind="step", step_index=0, worker="bench", timeout=600)
        return time.perf_counter() - started, result.record

    import tasks.execution.attempts as attempts_module

    root = logging.getLogger()
    install = attempts_module.capture_installed

    def without_capture(function):
        # The capture handler off the root logger, and attempt_run kept from putting it back.
        attempts_module.capture_installed = lambda: None
        root.removeHandler(attempt_log._handler)
        try:
            return once(function)
        finally:
            attempts_module.capture_installed = install
            install()

    timings: dict[str, list[float]] = {"with": [], "without": []}
    record = None
    for round_number in range(args.rounds):
        # Alternately first: neither variant always runs on a warmer (or busier) machine.
        for variant in ("with", "without") if round_number % 2 == 0 else ("without", "with"):
            if variant == "with":
                seconds, record = once(loud)
            else:
                seconds, _unused = without_capture(loud)
            timings[variant].append(seconds)
    with_capture, without = statistics.median(timings["with"]), statistics.median(timings["without"])
    print(f"a step logging {args.lines:,} lines ({args.format} format, median of {args.rounds}):")
    print(
        f"  with the capture:    {with_capture * 1000:8.1f} ms  ({len(record.log)} kept, {record.log_dropped} counted)"
    )
    print(f"  without the capture: {without * 1000:8.1f} ms")
    print(f"  ratio: {with_capture / without:.3f}")

    # A step that logs nothing: what the scope costs (set, reset, the handler check), per attempt.
    count = 20_000
    started = time.perf_counter()
    for _ in range(count):
        once(quiet)
    per_attempt = (time.perf_counter() - started) / count
    scope = log_fields.AttemptScope(task_id=uuid.uuid4(), pipeline="bench", step="quiet", attempt=1, kind="step")
    started = time.perf_counter()
    for _ in range(count):
        attempt_log.capture_installed()
        token = log_fields.current_attempt.set(scope)
        log_fields.current_attempt.reset(token)
    scope_cost = (time.perf_counter() - started) / count
    print(f"a step logging nothing: attempt_run {per_attempt * 1e6:.1f} µs, the log's part {scope_cost * 1e6:.2f} µs")


if __name__ == "__main__":
    main()
