"""Observability: what a task's run says about itself in logs, its attempts' own logs, traces and metrics.

- ``log_fields``: the ids every log line about a task carries (``task_fields``, ``AttemptFieldsFilter``).
- ``attempt_log``: the lines a step logged, kept with its attempt (``ctx.log``).
- ``tracing``: the tracing hooks, with no OpenTelemetry import; ``otel``: the spans, imported only when on.
- ``metrics``: the engine's counters and histograms, recorded once the change they count commits.
"""
