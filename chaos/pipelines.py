"""The campaign's own pipeline: the demo's report steps under a concurrency and a rate limit.

``report_limited`` runs the report pipeline's steps, compensations and failure notice against the same
platform, so every invariant of the report platform holds for its tasks too. It is held to
``max_concurrency`` 2 and ``rate_limit`` 10/s, which the campaign's load exceeds in bursts and always after
the pause it gets (its held tasks are released at once). Its charge step waits a moment after the platform
has charged: long enough for the campaign's client to cancel a task in the middle of a step, when the
charge is made and not yet checkpointed (its compensation must find the charge by replaying its key).

``report_approved`` is the report with a manager's approval between the charge and the report: a wait for the
signal ``manager_approval`` (the campaign's clients send it, ``chaos.signals``), then a short durable sleep;
its report step refuses to go on when the decision is "no", so a rejection, like a wait that times out, is
compensated (the charge refunded).

``chaos_tick`` is the campaign's schedule (``chaos.schedules``): a task every 2 s whose one step only returns.

Loaded by every process of the campaign's deployment (``RELIABILITY_PIPELINE_MODULES``); development only.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

from chaos.schedules import TICK_PIPELINE, TICK_SCHEDULE, TICK_SECONDS
from chaos.signals import APPROVAL_PIPELINE, APPROVAL_SIGNAL, APPROVAL_TIMEOUT, SLEEP_SECONDS, SLEEP_STEP
from chaos.workload import LIMITED_PIPELINE
from tasks import Pipeline
from tasks.demo import report_pipeline as demo
from tasks.exceptions import PermanentError
from tasks.pipelines.schedules import Schedule

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
    # A copy of every setting of the report pipeline (so one added there comes along), with the limits and
    # the waiting charge. The same step names give the same idempotency keys' shape
    # (rc-<task>-g<generation>-<step>-<effect>).
    steps = [
        dataclasses.replace(
            step, function=charge_quota_then_wait if step.name == demo.charge_quota.name else step.function
        )
        for step in demo.report.steps
    ]
    return dataclasses.replace(
        demo.report, name=LIMITED_PIPELINE, steps=steps, max_concurrency=MAX_CONCURRENCY, rate_limit=RATE_LIMIT
    )


report_limited = _limited_report()


# The code a rejected report fails with, for good (the pipeline compensates).
REJECTED = "approval_rejected"


def generate_report_if_approved(ctx) -> dict:
    """The demo's report, once the manager said yes; a "no" ends the task (compensated)."""
    decision = ctx.outputs[APPROVAL_SIGNAL] or {}
    if decision.get("approved") is not True:
        raise PermanentError(f"the manager said no: {decision.get('reason', '')}", code=REJECTED)
    return demo.generate_report(ctx)


def _approved_report() -> Pipeline:
    # The report's settings and steps (the same names give the same effect keys), with the wait and the sleep
    # declared through the public API after the charge.
    charge, generate, *rest = demo.report.steps
    pipeline = dataclasses.replace(demo.report, name=APPROVAL_PIPELINE, steps=[charge])
    pipeline.wait(APPROVAL_SIGNAL, timeout=APPROVAL_TIMEOUT, approval=True)
    pipeline.sleep(SLEEP_STEP, seconds=SLEEP_SECONDS)
    pipeline.steps += [dataclasses.replace(generate, function=generate_report_if_approved), *rest]
    return pipeline


report_approved = _approved_report()


tick = Pipeline(
    TICK_PIPELINE,
    schedules=[
        # "allow": a slot fires even while the one before still runs (a worker SIGKILLed under it), so every slot
        # of the run has its task unless no sweeper could fire it in time (then it is counted missed).
        Schedule(every=timedelta(seconds=TICK_SECONDS), name=TICK_SCHEDULE, input={"tick": True}, overlap="allow")
    ],
)


@tick.step
def tick_once(ctx) -> dict:
    return {"slot_input": ctx.input}
