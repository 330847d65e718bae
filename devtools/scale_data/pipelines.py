"""The search attributes the scale data's tasks carry (``devtools.scale_data.sql``), declared for the console
bench (``scripts/bench_console.py`` lists this module in ``RELIABILITY_PIPELINE_MODULES``): without a pipeline
that declares them, the console reads ``order_id:…`` as an ordinary search term."""

from tasks import FailurePolicy, Pipeline

scale_search = Pipeline(
    "scale_search", failure_policy=FailurePolicy.PARK, search_attributes=("order_id", "customer_id")
)


@scale_search.step
def nothing(ctx):
    return None
