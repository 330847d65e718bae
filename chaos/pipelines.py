"""The campaign's own pipeline: the demo's report steps under a concurrency and a rate limit.

``report_limited`` runs the report pipeline's steps, compensations and failure notice against the same
platform, so every invariant of the report platform holds for its tasks too. It is held to
``max_concurrency`` 2 and ``rate_limit`` 10/s, which the campaign's load exceeds in bursts and always after
the pause it gets (its held tasks are released at once). Its charge step waits a moment after the platform
has charged: long enough for the campaign's client to cancel a task in the middle of a step, when the
charge is made and not yet checkpointed (its compensation must find the charge by replaying its key).

Loaded by every process of the campaign's deployment (``RELIABILITY_PIPELINE_MODULES``); development only.
"""

from __future__ import annotations

import time

from chaos.workload import LIMITED_PIPELINE
from tasks.demo import report_pipeline as demo
from tasks.pipelines import Pipeline

MAX_CONCURRENCY = 2
RATE_LIMIT = "10/s"
# Long against a step's few milliseconds at the simulator, short against the step's 10 s timeout.
CHARGE_WAIT_SECONDS = 0.5


def charge_quota_then_wait(ctx) -> dict:
    """The demo's charge, then a wait (a slow confirmation, say) in which a cancel interrupts the step."""
    charge = demo.charge_quota(ctx)
    time.sleep(CHARGE_WAIT_SECONDS)  # the point of the step: a cancel interrupts this wait
    return charge


def _limited_report() -> Pipeline:
    report = demo.report
    pipeline = Pipeline(
        LIMITED_PIPELINE,
        retry=report.retry,
        failure_policy=report.failure_policy,
        default_step_timeout=report.default_step_timeout,
        validate_input=report.validate_input,
        on_failure=report.on_failure,
        on_failure_timeout=report.on_failure_timeout,
        max_concurrency=MAX_CONCURRENCY,
        rate_limit=RATE_LIMIT,
    )
    for step in report.steps:
        # The same names, so the same idempotency keys' shape (rc-<task>-g<generation>-<step>-<effect>).
        pipeline.step(
            charge_quota_then_wait if step.name == demo.charge_quota.name else step.function,
            name=step.name,
            timeout=step.timeout,
            retry=step.retry,
            compensate=step.compensate,
            compensation_timeout=step.compensation_timeout,
            compensation_retry=step.compensation_retry,
            transactional=step.transactional,
            effects=step.effects,
        )
    return pipeline


report_limited = _limited_report()
