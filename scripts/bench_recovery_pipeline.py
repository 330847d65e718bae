"""The recovery benchmark's pipeline (scripts/bench_recovery.py); only that benchmark's workers load it.

It is not one of the bench pipelines ``RELIABILITY_ENABLE_BENCH_PIPELINES`` registers: the benchmark puts
``scripts/`` on ``PYTHONPATH`` and names this module in ``RELIABILITY_PIPELINE_MODULES`` of its own processes.

``bench_recovery`` has two steps. ``block`` hangs on its first attempt, far longer than any lease, so only the
benchmark's SIGKILL of the worker ends it, and returns at once on any later attempt; ``finish`` does nothing.
Each attempt of ``block`` first records, in the task's Redis hash ``bench:recovery:<task id>`` (field: the
attempt number), the process it runs in and when it started: the benchmark learns there which worker to kill
and when the next attempt began, on the same host clock as its own.
"""

from __future__ import annotations

import json
import os
import time

import django_rq
from bench_recovery import PIPELINE_NAME, started_key
from django.conf import settings

from tasks import FailurePolicy, Pipeline

# Far beyond any lease the benchmark sets: the first attempt never ends by itself.
BLOCK_SECONDS = 3600

bench_recovery = Pipeline(PIPELINE_NAME, failure_policy=FailurePolicy.PARK)


@bench_recovery.step(timeout=BLOCK_SECONDS * 2)
def block(ctx):
    started = {"pid": os.getpid(), "started_at": time.time()}
    django_rq.get_connection(settings.RELIABILITY_QUEUE).hset(
        started_key(ctx.task_id), ctx.attempt, json.dumps(started)
    )
    if ctx.attempt == 1:
        time.sleep(BLOCK_SECONDS)
    return None


@bench_recovery.step
def finish(ctx):
    return None
