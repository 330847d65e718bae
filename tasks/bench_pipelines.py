"""No-op pipelines for benchmarks (enabled by RELIABILITY_ENABLE_BENCH_PIPELINES=1)."""

import time

from tasks import FailurePolicy, Pipeline


def _noop(ctx):
    return None


bench_noop_1 = Pipeline("bench_noop_1", failure_policy=FailurePolicy.PARK)
bench_noop_1.step(_noop, name="step_1")

bench_noop_10 = Pipeline("bench_noop_10", failure_policy=FailurePolicy.PARK)
for _index in range(1, 11):
    bench_noop_10.step(_noop, name=f"step_{_index}")

# Queues with priorities (make bench, priorities part): a bulk task that keeps its worker busy a moment, and a
# critical one that should start as soon as a worker is free.
BENCH_BULK_STEP_SECONDS = 0.05
bench_bulk = Pipeline("bench_bulk", failure_policy=FailurePolicy.PARK, queue="bulk")


@bench_bulk.step(name="step_1")
def _bulk_item(ctx):
    time.sleep(BENCH_BULK_STEP_SECONDS)


bench_critical = Pipeline("bench_critical", failure_policy=FailurePolicy.PARK, queue="critical")
bench_critical.step(_noop, name="step_1")
