"""A scheduled pipeline for the acceptance test of schedules only (its sweepers load it through
RELIABILITY_PIPELINE_MODULES): declared elsewhere, its slots would fire in every other test's sweeps."""

from datetime import timedelta

from tasks import Pipeline, Schedule

every_two_seconds = Pipeline(
    "t_every_two_seconds",
    schedules=[Schedule(every=timedelta(seconds=2), name="t-every-2s", input={"tick": True}, overlap="allow")],
)


@every_two_seconds.step
def tick(ctx):
    return {"ticked": True}
