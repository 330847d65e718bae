"""No-op pipelines for benchmarks (enabled by RELIABILITY_ENABLE_BENCH_PIPELINES=1)."""

from tasks.pipelines import FailurePolicy, Pipeline


def _noop(ctx):
    return None


bench_noop_1 = Pipeline("bench_noop_1", failure_policy=FailurePolicy.PARK)
bench_noop_1.step(_noop, name="step_1")

bench_noop_10 = Pipeline("bench_noop_10", failure_policy=FailurePolicy.PARK)
for _index in range(1, 11):
    bench_noop_10.step(_noop, name=f"step_{_index}")
