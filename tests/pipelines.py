"""Pipelines used only by tests (loaded in workers through RELIABILITY_PIPELINE_MODULES)."""

from __future__ import annotations

import logging
import os
import signal
import socket
from datetime import datetime, timedelta

from tasks import FailurePolicy, Pipeline
from tasks.demo.platform_client import ReportPlatform
from tasks.exceptions import PermanentError, TransientError
from tasks.pipelines.retry import RetryPolicy

# Step 2 kills its own worker process, every time.
crasher = Pipeline("t_crasher", retry=RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.2))


@crasher.step
def first(ctx):
    return {"ok": True}


@first.compensation
def undo_first(ctx):
    return None


@crasher.step
def die(ctx):
    os.kill(os.getpid(), signal.SIGKILL)


# A step that blocks in a raw socket read (no client timeout) on attempt 1.
blocker = Pipeline(
    "t_blocker",
    retry=RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.2, jitter=False),
    failure_policy=FailurePolicy.PARK,
)


@blocker.step(timeout=1.0)
def blocking_read(ctx):
    if ctx.attempt == 1:
        host, port = ctx.input["blackhole"]
        with socket.create_connection((host, port)) as sock:
            sock.recv(1)  # the far side accepts but never answers
    return {"attempt": ctx.attempt}


# Calls the platform with a short timeout: a hung HTTP call is cut by the step timeout.
http_blocker = Pipeline(
    "t_http_blocker",
    retry=RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.2, jitter=False),
    failure_policy=FailurePolicy.PARK,
)


@http_blocker.step(timeout=1.0)
def slow_report(ctx):
    platform = ReportPlatform(ctx)
    return platform.create_report(user_id="u-http", topic="t")


# In-process pipelines for service-level tests (no HTTP).
local = Pipeline("t_local", retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02))


@local.step
def local_a(ctx):
    return {"a": ctx.idempotency_key("a")}


@local_a.compensation
def local_undo_a(ctx):
    if ctx.input.get("fail_compensation"):
        raise TransientError("compensation target down", code="down")


@local.step
def local_b(ctx):
    if ctx.input.get("fail_b") == "permanent":
        raise PermanentError("refused", code="refused")
    if ctx.input.get("fail_b") == "transient":
        raise TransientError("flaky", code="flaky")
    if ctx.input.get("unstorable_output"):  # what PostgreSQL's jsonb refuses: a NUL, a lone surrogate
        return {"b": {"nul": "\x00", "surrogate": chr(0xD800)}[ctx.input["unstorable_output"]]}
    return {"b": 2}


# A step that runs longer than the lease: the heartbeat must keep the lease alive.
long_step = Pipeline("t_long", failure_policy=FailurePolicy.PARK)


@long_step.step(timeout=30)
def sleep_a_while(ctx):
    import time

    time.sleep(ctx.input["seconds"])
    return {"slept": ctx.input["seconds"]}


def _slow_validation(data):
    import time

    time.sleep(min(float(data.get("sleep", 0)), 5.0))
    return data


# Its input validation takes a while: a second request with the same key arrives mid-flight.
slow_input = Pipeline("t_slow_input", validate_input=_slow_validation, failure_policy=FailurePolicy.PARK)


@slow_input.step
def noop(ctx):
    return None


# Failures park in the DLQ for an operator (no automatic compensation).
parked = Pipeline(
    "t_parked", retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02), failure_policy=FailurePolicy.PARK
)


@parked.step(effects=("charge",))
def parked_charge(ctx):
    return {"charge": ctx.idempotency_key("charge")}


@parked_charge.compensation
def parked_refund(ctx):
    return None


@parked.step(transactional=True)
def parked_record(ctx):
    return {"recorded": True}


@parked.step
def parked_finish(ctx):
    if ctx.input.get("fail") and not ctx.input.get("fixed"):
        raise PermanentError("the far side refused", code="refused")
    return {"done": True}


# Leaks its input into its output, its errors and its compensation's error: redaction must catch every one.
leaky = Pipeline("t_leaky", retry=RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=0.1, jitter=False))


@leaky.step
def leaky_echo(ctx):
    return {"echo": f"called with {ctx.input}", "note": ctx.input.get("note", "")}


@leaky_echo.compensation
def leaky_undo(ctx):
    raise PermanentError(f"refund refused for {ctx.input} after {ctx.output}", code="refund_refused")


@leaky.step
def leaky_reject(ctx):
    if ctx.attempt == 1:
        # What a failed requests call says: the URL, its query string and all.
        raise TransientError(
            f"502 Server Error for url: https://api.example.com/v1/charge?api_key={ctx.input['api_key']}&user=u1",
            code="bad_gateway",
        )
    raise ValueError(f"rejected {ctx.input}")


# An adopter's step as docs/write-a-pipeline.md shows it: plain requests and raise_for_status(), no engine client.
raw_http = Pipeline(
    "t_raw_http", retry=RetryPolicy(max_attempts=4, base_delay=0.1, max_delay=0.2), failure_policy=FailurePolicy.PARK
)


@raw_http.step
def raw_http_report(ctx):
    import requests
    from django.conf import settings

    response = requests.post(
        f"{settings.REPORT_PLATFORM_URL}/v1/reports",
        json={"user_id": ctx.input["user_id"], "topic": "raw http"},
        headers={
            "X-Task-Id": str(ctx.task_id),
            "X-Request-Deadline": str(ctx.call_deadline_ms),
            "Idempotency-Key": ctx.idempotency_key("report"),
        },
        timeout=ctx.remaining(),
    )
    response.raise_for_status()
    return {"report_id": response.json()["report_id"]}


# An adopter's pipeline on ctx.http (issue #13, point 1), against the platform simulator's quota and reports API.
http_pay = Pipeline(
    "t_http_pay",
    retry=RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.2),
    failure_policy=FailurePolicy.COMPENSATE,
)


def _platform_url() -> str:
    from django.conf import settings

    return settings.REPORT_PLATFORM_URL


@http_pay.step(timeout=20)
def http_pay_charge(ctx):
    response = ctx.http.post(
        f"{_platform_url()}/v1/quota/charges", json={"user_id": ctx.input["user_id"], "units": 1}, effect="charge"
    )
    response.raise_for_status()
    return {"charge_id": response.json()["charge_id"]}


@http_pay_charge.compensation
def http_pay_refund(ctx):
    charge_id = (ctx.output or {}).get("charge_id")
    if charge_id is None:
        # The charge's outcome is unknown: replaying it under its own key returns the charge without acting twice.
        response = ctx.http.post(
            f"{_platform_url()}/v1/quota/charges", json={"user_id": ctx.input["user_id"], "units": 1}, effect="charge"
        )
        response.raise_for_status()
        charge_id = response.json()["charge_id"]
    ctx.http.post(f"{_platform_url()}/v1/quota/charges/{charge_id}/refund", json={}, effect="refund").raise_for_status()


@http_pay.step
def http_pay_ship(ctx):
    response = ctx.http.post(
        f"{_platform_url()}/v1/reports", json={"user_id": ctx.input["user_id"], "topic": "ship"}, effect="report"
    )
    response.raise_for_status()
    return {"report_id": response.json()["report_id"]}


# One step, two calls: the charge goes through, then the report is refused (a fault rule answers 409).
http_two_calls = Pipeline(
    "t_http_two_calls", retry=RetryPolicy(max_attempts=2, base_delay=0.1, max_delay=0.2), failure_policy="compensate"
)


@http_two_calls.step(timeout=20)
def charge_then_report(ctx):
    http_pay_charge(ctx)
    http_pay_ship(ctx)
    return None


charge_then_report.compensation(http_pay_refund)


# The mistake ctx.http exists to catch: a mutating call that names no effect.
http_no_effect = Pipeline("t_http_no_effect", failure_policy=FailurePolicy.PARK)


@http_no_effect.step
def http_no_effect_post(ctx):
    ctx.http.post(f"{_platform_url()}/v1/reports", json={"user_id": "u-careless", "topic": "oops"})


# Its steps depend on RC_TEST_PIPELINE_SHAPE, read at import: workers started again with another
# shape run a changed pipeline, as after a deploy with tasks in flight (issue #13, point 4).
# "four": shape_1 … shape_4; "appended": and shape_5 at the end; "inserted": shape_1b before shape_2.
# shape_3 fails transiently until the file named by input "gate" exists: the task waits after step 2.
PIPELINE_SHAPE = os.environ.get("RC_TEST_PIPELINE_SHAPE", "four")
shaped = Pipeline(
    "t_shaped",
    retry=RetryPolicy(max_attempts=100, base_delay=0.2, max_delay=0.2, jitter=False),
    failure_policy=FailurePolicy.PARK,
)


def _shaped_step(name: str):
    def run(ctx):
        if name == "shape_3" and not os.path.exists(ctx.input["gate"]):
            raise TransientError("the gate is closed", code="gate_closed")
        return {"step": name, "shape": PIPELINE_SHAPE, "seen": sorted(ctx.outputs)}

    return shaped.step(run, name=name)


_shape_names = ["shape_1", "shape_2", "shape_3", "shape_4"]
if PIPELINE_SHAPE == "appended":
    _shape_names.append("shape_5")
elif PIPELINE_SHAPE == "inserted":
    _shape_names.insert(1, "shape_1b")
for _name in _shape_names:
    _shaped_step(_name)


# Queues with priorities: a bulk pipeline whose tasks take a moment each, and a critical one.
bulk_work = Pipeline(
    "t_bulk", queue="bulk", failure_policy=FailurePolicy.PARK, retry=RetryPolicy(max_attempts=3, base_delay=60)
)


@bulk_work.step
def bulk_item(ctx):
    import time

    if ctx.input.get("transient"):
        raise TransientError("bulk item not ready yet")
    if ctx.input.get("fail"):
        raise PermanentError("bulk item refused", code="bulk_refused")
    time.sleep(float(ctx.input.get("seconds", 0.02)))
    return None


critical_work = Pipeline("t_critical", queue="critical", failure_policy=FailurePolicy.PARK)


@critical_work.step
def critical_item(ctx):
    return None


# Live control (issue #14): a pipeline of three compensated steps whose middle step can cancel its own
# task in-process (a canceller arriving mid-step), a parked-cancel twin, and limited pipelines.
def _effect_step(name: str):
    def step(ctx):
        if ctx.input.get("cancel_during") == name:
            from tasks.lifecycle.cancellation import task_cancel

            task_cancel(task_id=ctx.task_id, actor="test:mid-step", reason="stop it")
        if ctx.input.get("fail_in") == name:
            raise PermanentError("refused by the far side", code="refused")
        if ctx.input.get("sleep_in") == name:
            import time

            time.sleep(float(ctx.input.get("seconds", 5)))
        return {"done": name}

    step.__name__ = name
    return step


def _undo(name: str):
    def undo(ctx):
        return None

    undo.__name__ = f"undo_{name}"
    return undo


cancellable = Pipeline("t_cancellable", retry=RetryPolicy(max_attempts=3, base_delay=30, max_delay=60, jitter=False))
cancel_parked = Pipeline("t_cancel_parked", on_cancel=FailurePolicy.PARK)
for _pipeline in (cancellable, cancel_parked):
    for _name in ("c_one", "c_two", "c_three"):
        _pipeline.step(_effect_step(_name), compensate=_undo(_name), timeout=30)

# A step that fails transiently once (a retry is scheduled far ahead), then succeeds.
flaky_first = Pipeline("t_flaky_first", retry=RetryPolicy(max_attempts=3, base_delay=60, max_delay=60, jitter=False))


@flaky_first.step
def flaky_done(ctx):
    return {"ok": True}


@flaky_done.compensation
def flaky_undo(ctx):
    return None


@flaky_first.step
def flaky_retry(ctx):
    if ctx.attempt == 1:
        raise TransientError("not yet", code="not_yet")
    return {"ok": True}


one_at_a_time = Pipeline("t_one_at_a_time", max_concurrency=1)


@one_at_a_time.step
def one_at_a_time_step(ctx):
    return None


two_per_second = Pipeline("t_two_per_second", rate_limit="2/s")


@two_per_second.step
def rated_a(ctx):
    return None


@two_per_second.step
def rated_b(ctx):
    return None


# Live control against real workers (issue #14 acceptance). Four steps, each charging the platform, undone by
# http_pay's refund (which replays the charge when the step's effect is uncertain). A step named in input
# "work_ms" first does that much work at the platform, one named in "sleep_s" sleeps first: the slow step a
# cancel interrupts. Retries wait long, so a retry-scheduled task stays so.
live_cancel = Pipeline("t_live_cancel", retry=RetryPolicy(max_attempts=3, base_delay=30, max_delay=60, jitter=False))


def _live_charge_step(name: str):
    def step(ctx):
        import time

        if ctx.input.get("sleep_s", {}).get(name):
            time.sleep(ctx.input["sleep_s"][name])
        work_ms = ctx.input.get("work_ms", {}).get(name)
        if work_ms:
            ctx.http.post(f"{_platform_url()}/v1/work", json={"ms": work_ms}, effect="work").raise_for_status()
        response = ctx.http.post(
            f"{_platform_url()}/v1/quota/charges", json={"user_id": ctx.input["user_id"], "units": 1}, effect="charge"
        )
        response.raise_for_status()
        return {"charge_id": response.json()["charge_id"]}

    step.__name__ = name
    return step


LIVE_CANCEL_STEPS = ("lc_one", "lc_two", "lc_three", "lc_four")
for _name in LIVE_CANCEL_STEPS:
    live_cancel.step(_live_charge_step(_name), compensate=http_pay_refund, timeout=120)


def _work_step(pipeline: Pipeline, name: str):
    """A step that does input "ms" (default 0) of work at the platform: its start and end are recorded there."""

    def step(ctx):
        response = ctx.http.post(f"{_platform_url()}/v1/work", json={"ms": ctx.input.get("ms", 0)}, effect="work")
        response.raise_for_status()
        return {"work_id": response.json()["work_id"]}

    step.__name__ = name
    return pipeline.step(step, timeout=120)


live_work = Pipeline("t_live_work")
_work_step(live_work, "work_one")
_work_step(live_work, "work_two")
# At most two at once (overridable at runtime), one at a time, and five step starts a second.
live_limited = Pipeline("t_live_limited", max_concurrency=2)
_work_step(live_limited, "limited_work")
live_single = Pipeline("t_live_single", max_concurrency=1)
_work_step(live_single, "single_work")
live_rated = Pipeline("t_live_rated", rate_limit="5/s")
_work_step(live_rated, "rated_one")
_work_step(live_rated, "rated_two")


# Steps that do nothing: what remains is the engine's own conversation with PostgreSQL and Redis
# (tests/acceptance/test_round_trips.py counts it).
def _nothing(ctx):
    return None


quiet_one = Pipeline("t_quiet_1", failure_policy=FailurePolicy.PARK)
quiet_one.step(_nothing, name="step_1")
quiet_ten = Pipeline("t_quiet_10", failure_policy=FailurePolicy.PARK)
for _index in range(1, 11):
    quiet_ten.step(_nothing, name=f"step_{_index}")


# A batch's job asks for higher-priority work at most every tasks.delivery.jobs.PRIORITY_CHECK_SECONDS of its clock.
# These steps take input "seconds" of STEP_CLOCK's time, not the wall clock's: a test gives STEP_CLOCK to
# tasks.delivery.jobs
# in place of the time module (monotonic time is outside the project), so when a batch asks is a count, not a race.
class StepClock:
    """A monotonic clock that only the steps below move."""

    now = 0.0

    def monotonic(self) -> float:
        return self.now


STEP_CLOCK = StepClock()


def _clocked(ctx):
    STEP_CLOCK.now += float(ctx.input.get("seconds", 0))
    return None


clocked_bulk = Pipeline("t_clocked_bulk", queue="bulk", failure_policy=FailurePolicy.PARK)
clocked_bulk.step(_clocked, name="clocked_work")
clocked_critical = Pipeline("t_clocked_critical", queue="critical", failure_policy=FailurePolicy.PARK)
clocked_critical.step(_clocked, name="clocked_work")


# Durable sleeps (Pipeline.sleep): a fixed length, a time read from the input, and a sleep as the last step.
def _before_sleep(ctx):
    return {"prepared": ctx.input.get("n", 0)}


def _after_sleep(ctx):
    return {"slept_until": ctx.outputs["cool_off"]["slept_until"], "prepared": ctx.outputs["before_sleep"]}


def _until_from_input(ctx):
    value = ctx.input["until"]
    return datetime.fromisoformat(value) if isinstance(value, str) else value


sleep_seconds = Pipeline("t_sleep_seconds", failure_policy=FailurePolicy.PARK)
sleep_seconds.step(_before_sleep, name="before_sleep")
sleep_seconds.sleep("cool_off", seconds=3)
sleep_seconds.step(_after_sleep, name="after_sleep")
sleep_until = Pipeline("t_sleep_until", failure_policy=FailurePolicy.PARK, on_cancel=FailurePolicy.PARK)
sleep_until.step(_before_sleep, name="before_sleep")
sleep_until.sleep("cool_off", until=_until_from_input)
sleep_until.step(_after_sleep, name="after_sleep")
sleep_last = Pipeline("t_sleep_last", failure_policy=FailurePolicy.PARK)
sleep_last.step(_before_sleep, name="before_sleep")
sleep_last.sleep("cool_off", until=_until_from_input)


# Waits for a signal (Pipeline.wait): a step, a wait, a step that reads what the signal said.
def _draft_refund(ctx):
    return {"refund": ctx.input.get("amount", 10)}


def _pay_refund(ctx):
    decision = ctx.outputs["manager_approval"]
    return {"paid": bool(decision and decision.get("approved")), "decision": decision}


approval = Pipeline("t_approval", failure_policy=FailurePolicy.PARK, on_cancel=FailurePolicy.PARK)
approval.step(_draft_refund, name="draft_refund")
approval.wait("manager_approval", timeout=timedelta(seconds=30), approval=True)
approval.step(_pay_refund, name="pay_refund")
# A short timeout, and compensation when it passes.
approval_short = Pipeline("t_approval_short", failure_policy=FailurePolicy.COMPENSATE)
approval_short.step(_draft_refund, name="draft_refund", compensate=lambda ctx: None)
approval_short.wait("manager_approval", timeout=1)
approval_short.step(_pay_refund, name="pay_refund")


# Logs through its own module logger and through ctx.log (issue 24): each attempt keeps what its step said.
step_logger = logging.getLogger("tests.pipelines.logging")
logging_steps = Pipeline(
    "t_logging",
    retry=RetryPolicy(max_attempts=2, base_delay=0.05, max_delay=0.1, jitter=False),
    failure_policy=FailurePolicy.PARK,
)


@logging_steps.step
def log_lines(ctx):
    label = ctx.input["label"]
    step_logger.info("module logger says %s in attempt %d", label, ctx.attempt)
    ctx.log.info("ctx.log says %s in attempt %d", label, ctx.attempt)
    if ctx.input.get("leak"):
        # A step that logs its secrets by mistake: the input's api_key, and a bearer token under no secret key.
        ctx.log.warning("calling the far side with api_key=%s", ctx.input["api_key"])
        step_logger.info("headers: Authorization: Bearer %s", ctx.input["note"])
    for number in range(ctx.input.get("lines", 0)):
        step_logger.info("line %d of %s", number, label)
    if ctx.input.get("retry_once") and ctx.attempt == 1:
        raise TransientError(f"{label}: try again", code="again")
    if ctx.input.get("fail"):
        step_logger.error("%s gives up", label)
        raise PermanentError(f"{label}: refused", code="refused")
    return {"label": label}


# Traces (tasks.observability.tracing): a call through ctx.http to the URL of the input, retried on a 5xx, then a quick
# step.
traced_http = Pipeline(
    "t_traced_http",
    retry=RetryPolicy(max_attempts=6, base_delay=0.2, max_delay=0.3, jitter=False),
    failure_policy=FailurePolicy.PARK,
)


@traced_http.step(timeout=30)
def traced_call(ctx):
    # The worker's process id tells the test which worker made the call (the one it kills).
    ctx.http.get(ctx.input["url"], headers={"X-Worker-Pid": str(os.getpid())}).raise_for_status()
    return {"called": ctx.attempt}


@traced_http.step
def traced_done(ctx):
    return {"done": True}
