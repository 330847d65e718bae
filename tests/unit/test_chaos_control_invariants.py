"""The checker on live control: a valid run with cancels, a pause and limits holds; each breakage is caught.

The run is ``test_chaos_invariants.valid_run`` plus the campaign's limited pipeline (max_concurrency 2,
5 starts per second) and three more tasks. Times are seconds after NOW_MS.

t-limited: report_limited, succeeded, steps from 10.0 s (the charge waits 0.5 s).
t-paused: report_limited, succeeded; its charge ran up to 11.9 s, its report started at 12.02 s, just
after the pipeline was paused (at 12.0 s: its gate, the charge's write, had read the row before), then it
was held until the resume (15.0 s) and a new claim ran its last two steps.
t-cancelled: report_limited, cancelled at 20.3 s in the middle of its charge (started 20.0 s, interrupted
at 20.4 s); the compensation replayed the charge's key, found the charge and refunded it. Its client
sent the cancel twice (202, then 200, naming the same cancel).
t-queued: report, cancelled at 30.0 s before any step (200). The client also cancelled t-succeeded after
it had finished (409).
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from chaos.control_invariants import CLAIM_SLACK_SECONDS
from chaos.invariants import RecordError, check, format_table, validate_record
from tests.unit.test_chaos_invariants import (
    ALL_INVARIANTS,
    NOW_MS,
    OK,
    REPORT_STEPS,
    at,
    attempt,
    call,
    failing,
    key,
    ledger,
    policy,
    submission,
    task,
    valid_run,
    violations,
)

LIMITED = "report_limited"
LIM, PAUSED, CANCELLED, QUEUED = "t-limited", "t-paused", "t-cancelled", "t-queued"
CANCEL_AT, QUEUED_CANCEL_AT, PAUSE_AT, RESUME_AT = 20.3, 30.0, 12.0, 15.0


def api_time(seconds: float) -> str:
    """A time as the API shows it (Django's JSON: milliseconds, "Z")."""
    return datetime.fromtimestamp(NOW_MS / 1000 + seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def cancel(request_id, task_id, status, state, requested_at=None, repeat=False):
    return {
        "request_id": request_id,
        "task_id": task_id,
        "mode": "running",
        "repeat": repeat,
        "status": status,
        "state": state,
        "requested_at": api_time(requested_at) if requested_at is not None else None,
        "error": "",
    }


def timed_call(seq, seconds, method, path, task_id, idempotency_key, body, status, kind, **flags):
    made = call(seq, method, path, task_id, idempotency_key, body, status, kind, **flags)
    made["received_ms"] = NOW_MS + round(seconds * 1000)
    return made


def succeeded_effects(record: dict, task_id: str, charge_id: str) -> None:
    platform = record["platform"]
    platform["charges"][charge_id] = {"user_id": "u-lim", "units": 1, "refunded": False, "task_id": task_id}
    platform["reports"].append({"report_id": f"rep-{task_id}", "user_id": "u-lim", "topic": "t", "task_id": task_id})
    platform["files"][f"report-{task_id}-g0.txt"] = {"content": "text", "task_id": task_id}
    platform["notifications"].append({"notification_id": f"ntf-{task_id}", "user_id": "u-lim", "task_id": task_id})
    record["ledger"] += [
        ledger(task_id, "charge_quota", "charge"),
        ledger(task_id, "generate_report", "report"),
        ledger(task_id, "upload_file", "file"),
        ledger(task_id, "notify_user", "notification"),
    ]


def live_run() -> dict:
    record = valid_run()
    meta = record["meta"]
    meta["platform_pipelines"] = ["report", LIMITED]
    meta["policies"][LIMITED] = policy(max_concurrency=2, rate_limit=(5, 1))
    record["tasks"] += [
        task(LIM, "succeeded", "sub-lim", pipeline=LIMITED),
        task(PAUSED, "succeeded", "sub-paused", pipeline=LIMITED),
        task(CANCELLED, "cancelled", "sub-cancelled", pipeline=LIMITED, reason="cancelled", cancel_at=CANCEL_AT),
        task(QUEUED, "cancelled", "sub-queued", reason="cancelled", cancel_at=QUEUED_CANCEL_AT),
    ]
    record["submissions"] += [
        submission("r-lim", LIM, "sub-lim"),
        submission("r-paused", PAUSED, "sub-paused"),
        submission("r-cancelled", CANCELLED, "sub-cancelled"),
        submission("r-queued", QUEUED, "sub-queued"),
    ]
    record["attempts"] += [
        attempt(LIM, 0, "charge_quota", 1, "succeeded", start=10.0, took=0.5),
        attempt(LIM, 1, "generate_report", 1, "succeeded", start=10.55),
        attempt(LIM, 2, "upload_file", 1, "succeeded", start=10.65),
        attempt(LIM, 3, "notify_user", 1, "succeeded", start=10.75),
        attempt(PAUSED, 0, "charge_quota", 1, "succeeded", start=11.4, took=0.5),
        attempt(PAUSED, 1, "generate_report", 1, "succeeded", start=12.02),
        attempt(PAUSED, 2, "upload_file", 1, "succeeded", start=15.2, token=2),
        attempt(PAUSED, 3, "notify_user", 1, "succeeded", start=15.3, token=2),
        attempt(CANCELLED, 0, "charge_quota", 1, "cancelled", start=20.0, took=0.4),
        attempt(CANCELLED, 0, "charge_quota", 1, "succeeded", kind="compensation", start=20.45),
    ]
    succeeded_effects(record, LIM, "ch_000020")
    succeeded_effects(record, PAUSED, "ch_000021")
    record["platform"]["charges"]["ch_000030"] = {
        "user_id": "u-lim",
        "units": 1,
        "refunded": True,
        "task_id": CANCELLED,
    }
    record["ledger"].append(ledger(CANCELLED, "charge_quota", "charge", "compensated"))
    charge_key, body = key(CANCELLED, "charge_quota", "charge"), {"user_id": "u-lim", "units": 1}
    refund = "/v1/quota/charges/ch_000030/refund"
    record["calls"] += [
        timed_call(20, 20.01, "POST", "/v1/quota/charges", CANCELLED, charge_key, body, 201, "charge", effect=True),
        # The compensation: the interrupted charge's answer was lost, so it replays the key to learn the charge.
        timed_call(21, 20.46, "POST", "/v1/quota/charges", CANCELLED, charge_key, body, 201, "charge", effect=False),
        timed_call(
            22,
            20.47,
            "POST",
            refund,
            CANCELLED,
            key(CANCELLED, "charge_quota", "refund"),
            {},
            200,
            "refund",
            effect=True,
        ),
    ]
    record["cancels"] += [
        cancel("c-1", CANCELLED, 202, "running", CANCEL_AT),
        cancel("c-2", CANCELLED, 200, "cancelled", CANCEL_AT, repeat=True),
        cancel("c-3", QUEUED, 200, "cancelled", QUEUED_CANCEL_AT),
        cancel("c-4", OK, 409, "succeeded"),
    ]
    record["controls"] += [
        {"action": "pause", "pipeline": LIMITED, "called_at": at(PAUSE_AT - 0.01), "returned_at": at(PAUSE_AT)},
        {"action": "resume", "pipeline": LIMITED, "called_at": at(RESUME_AT), "returned_at": at(RESUME_AT + 0.01)},
    ]
    return record


@pytest.fixture
def run() -> dict:
    return copy.deepcopy(live_run())


def the_task(record: dict, task_id: str) -> dict:
    return next(t for t in record["tasks"] if t["id"] == task_id)


def attempts_of(record: dict, task_id: str, step_name: str, kind: str = "step") -> list[dict]:
    return [
        a for a in record["attempts"] if a["task_id"] == task_id and a["step_name"] == step_name and a["kind"] == kind
    ]


def extra_starts(record: dict, starts: list[float], took: float = 0.01, token: int | None = None) -> None:
    """Step attempts of t-limited starting at ``starts``, each a run of its own (a claim) or, with ``token``,
    all one run (each but the first let through at the boundary of the one before); within the retry budget."""
    for n, start in enumerate(starts):
        step = REPORT_STEPS[n % len(REPORT_STEPS)]
        record["attempts"].append(
            attempt(
                LIM,
                REPORT_STEPS.index(step),
                step,
                2,
                "succeeded" if token else "transient_error",
                start=start,
                took=took,
                token=token or 10 + n,
            )
        )


# --- the valid run --------------------------------------------------------------------------------------------------


def test_a_run_with_cancels_a_pause_and_limits_holds_every_invariant(run):
    results = check(run)

    assert [result.name for result in results] == ALL_INVARIANTS
    assert failing(run) == set()
    checked = {result.name: result.checked for result in results}
    # cancelled tasks, tasks with a cancel, cancel requests, limited step attempts judged (the last three)
    control = ALL_INVARIANTS[
        ALL_INVARIANTS.index("cancelled_compensated") : ALL_INVARIANTS.index("rate_within_limit") + 1
    ]
    assert [checked[name] for name in control] == [2, 2, 4, 9, 9, 9]


def test_cancelled_is_a_terminal_state_and_a_task_still_cancelling_is_not(run):
    assert violations(run, "all_terminal") == ()

    the_task(run, QUEUED)["state"] = "compensating"

    assert violations(run, "all_terminal") == (f"task {QUEUED} (request r-queued): lost task, still compensating",)


# --- every effect of a cancelled task compensated -------------------------------------------------------------------


def test_a_charge_of_a_cancelled_task_left_unrefunded_is_caught(run):
    run["platform"]["charges"]["ch_000030"]["refunded"] = False
    run["calls"] = [c for c in run["calls"] if c["kind"] != "refund"]

    assert failing(run) == {"cancelled_compensated"}
    assert violations(run, "cancelled_compensated") == (f"task {CANCELLED} (cancelled): charge ch_000030 not refunded",)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda r: r["platform"]["files"].update({f"report-{CANCELLED}-g0.txt": {"task_id": CANCELLED}}),
            f"file report-{CANCELLED}-g0.txt left at the platform",
        ),
        (
            lambda r: r["ledger"][-1].update(status="uncertain"),
            f"ledger: {key(CANCELLED, 'charge_quota', 'charge')} is uncertain, not compensated",
        ),
        (
            lambda r: r["dlq_items"].append({"task_id": CANCELLED, "status": "open", "reason_code": "cancelled"}),
            "1 unresolved DLQ items, expected none",
        ),
        (
            lambda r: r["attempts"].append(
                attempt(CANCELLED, -1, "on_failure", 1, "succeeded", kind="failure_notice", start=20.6)
            ),
            "its failure notice ran 1 times (never for a cancel)",
        ),
    ],
    ids=["file-left", "ledger-uncertain", "dead-letter-open", "failure-notice"],
)
def test_a_cancelled_task_with_an_effect_not_undone_or_a_failure_record_is_caught(run, change, expected):
    change(run)

    assert failing(run) == {"cancelled_compensated"}
    assert violations(run, "cancelled_compensated") == (f"task {CANCELLED} (cancelled): {expected}",)


def test_a_cancel_whose_compensation_failed_has_its_one_dead_letter(run):
    the_task(run, CANCELLED)["state"] = "compensation_failed"
    run["cancels"][1]["state"] = "compensation_failed"
    run["dlq_items"].append({"task_id": CANCELLED, "status": "open", "reason_code": "cancelled"})
    assert failing(run) == set()

    run["dlq_items"][-1]["status"] = "resolved"

    assert failing(run) == {"cancelled_compensated", "failed_compensated"}
    assert violations(run, "cancelled_compensated") == (
        f"task {CANCELLED} (compensation_failed): 0 unresolved DLQ items, expected 1",
    )


# --- nothing started once the cancel was seen -----------------------------------------------------------------------


def test_the_step_a_claim_let_through_just_before_the_cancel_may_start_after_it(run):
    (charge,) = attempts_of(run, CANCELLED, "charge_quota")
    charge.update(started_at=at(CANCEL_AT + CLAIM_SLACK_SECONDS / 2))

    assert failing(run) == set()


def test_a_step_started_at_a_boundary_written_after_the_cancel_is_caught(run):
    (charge,) = attempts_of(run, CANCELLED, "charge_quota")
    charge.update(outcome="succeeded", finished_at=at(CANCEL_AT + 0.1))
    run["attempts"].append(attempt(CANCELLED, 1, "generate_report", 1, "succeeded", start=CANCEL_AT + 0.15))

    assert failing(run) == {"nothing_after_cancel"}
    assert violations(run, "nothing_after_cancel") == (
        f"task {CANCELLED} (cancel at {at(CANCEL_AT)}): step 'generate_report' attempt 1 (started "
        f"{at(CANCEL_AT + 0.15)}) was let through after the cancel by the write of step 'charge_quota' "
        f"(finished {at(CANCEL_AT + 0.1)})",
    )


def test_a_step_claimed_well_after_the_cancel_is_caught(run):
    start = CANCEL_AT + CLAIM_SLACK_SECONDS + 0.5
    run["attempts"].append(attempt(CANCELLED, 1, "generate_report", 1, "transient_error", start=start, token=2))

    (violation,) = violations(run, "nothing_after_cancel")
    assert violation.endswith("was let through after the cancel by its claim (at most 1 s before it started)")


def test_more_than_one_step_started_after_the_cancel_is_caught(run):
    run["attempts"] += [
        attempt(CANCELLED, 0, "charge_quota", 2, "transient_error", start=CANCEL_AT + 0.1, token=2),
        attempt(CANCELLED, 0, "charge_quota", 3, "transient_error", start=CANCEL_AT + 0.3, token=3),
    ]

    (violation,) = violations(run, "nothing_after_cancel")
    assert f"task {CANCELLED} (cancel at {at(CANCEL_AT)}): 2 step attempts started after the cancel" in violation


def test_a_platform_call_under_the_key_of_a_step_that_had_not_started_is_caught(run):
    report_key, body = key(CANCELLED, "generate_report", "report"), {"user_id": "u-lim", "topic": "t"}
    run["calls"].append(
        timed_call(23, 20.5, "POST", "/v1/reports", CANCELLED, report_key, body, 200, "report", effect=False)
    )

    assert failing(run) == {"nothing_after_cancel"}
    assert violations(run, "nothing_after_cancel") == (
        f"task {CANCELLED} (cancel at {at(CANCEL_AT)}): call seq 23 POST /v1/reports under the key of step "
        "'generate_report', which had not started by the cancel",
    )


def test_a_crashed_attempt_may_have_started_before_the_cancel(run):
    """A crash hides when its attempt began: its step's calls are not judged."""
    run["attempts"].append(attempt(CANCELLED, 1, "generate_report", 1, "crashed", token=1))
    report_key, body = key(CANCELLED, "generate_report", "report"), {"user_id": "u-lim", "topic": "t"}
    run["calls"].append(
        timed_call(23, 20.5, "POST", "/v1/reports", CANCELLED, report_key, body, 200, "report", effect=False)
    )

    assert failing(run) == set()


# --- cancels answered as promised -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "change", "expected"),
    [
        (
            1,
            {"requested_at": api_time(CANCEL_AT + 0.5)},
            f"cancel c-2 of task {CANCELLED}: answered requested_at {api_time(CANCEL_AT + 0.5)}, "
            f"the task's cancel is {at(CANCEL_AT)}",
        ),
        (0, {"status": 200}, f"cancel c-1 of task {CANCELLED}: answered 200 while the task was running"),
        (2, {"status": 202}, f"cancel c-3 of task {QUEUED}: answered 202 (under way) for a task already cancelled"),
        (
            2,
            {"status": 409, "requested_at": None},
            f"cancel c-3 of task {QUEUED}: refused (409) although its cancel of {at(QUEUED_CANCEL_AT)} holds",
        ),
        (3, {"state": "failed"}, f"cancel c-4 of task {OK}: refused (409) as failed, but the task ended succeeded"),
        (3, {"status": 404}, f"cancel c-4 of task {OK}: answered 404"),
    ],
    ids=["another-cancel", "200-running", "202-terminal", "409-cancelled", "409-wrong-state", "404"],
)
def test_a_cancel_answered_against_the_apis_promise_is_caught(run, index, change, expected):
    run["cancels"][index].update(change)

    assert failing(run) == {"cancel_answers"}
    assert violations(run, "cancel_answers") == (expected,)


def test_a_task_cancelled_by_no_request_of_the_record_is_caught(run):
    del run["cancels"][2]

    assert violations(run, "cancel_answers") == (
        f"task {QUEUED}: cancelled at {at(QUEUED_CANCEL_AT)}, by no recorded request",
    )


def test_a_cancel_without_an_answer_is_not_judged(run):
    run["cancels"][0].update(status=0, state=None, requested_at=None)

    assert failing(run) == set()


# --- nothing started while paused -----------------------------------------------------------------------------------


def test_a_step_claimed_during_the_pause_is_caught(run):
    (upload,) = attempts_of(run, PAUSED, "upload_file")
    upload.update(started_at=at(13.5), finished_at=at(13.55))

    assert failing(run) == {"nothing_started_while_paused"}
    assert violations(run, "nothing_started_while_paused") == (
        f"task {PAUSED}: step 'upload_file' attempt 1 (started {at(13.5)}) while {LIMITED} was paused, let through "
        "by its claim (at most 1 s before it started)",
    )


def test_a_step_started_at_a_boundary_written_during_the_pause_is_caught(run):
    (charge,) = attempts_of(run, PAUSED, "charge_quota")
    charge.update(finished_at=at(PAUSE_AT + 0.01))

    (violation,) = violations(run, "nothing_started_while_paused")
    assert f"let through by the write of step 'charge_quota' (finished {at(PAUSE_AT + 0.01)})" in violation


def test_a_claim_just_before_the_pause_committed_may_start_its_step_after_it(run):
    (upload,) = attempts_of(run, PAUSED, "upload_file")
    upload.update(started_at=at(PAUSE_AT + CLAIM_SLACK_SECONDS / 2), finished_at=at(PAUSE_AT + 0.55))

    assert failing(run) == set()


def test_a_pause_that_failed_holds_nothing_back(run):
    (upload,) = attempts_of(run, PAUSED, "upload_file")
    upload.update(started_at=at(13.5), finished_at=at(13.55))
    run["controls"][0]["failed"] = True

    assert failing(run) == set()


def test_a_pause_never_resumed_holds_until_the_end(run):
    del run["controls"][1]

    found = violations(run, "nothing_started_while_paused")
    assert [violation.split(":")[0] for violation in found] == [f"task {PAUSED}"] * 2 + [f"task {CANCELLED}"]
    assert found[0].startswith(f"task {PAUSED}: step 'upload_file' attempt 1 (started {at(15.2)})")


# --- limits ---------------------------------------------------------------------------------------------------------


def test_more_step_attempts_at_once_than_max_concurrency_is_caught(run):
    extra_starts(run, [40.0, 40.1, 40.2], took=0.5)

    assert failing(run) == {"concurrency_within_limit"}
    assert violations(run, "concurrency_within_limit") == (
        f"{LIMITED}: 3 step attempts at once (limit 2) at {at(40.2)}: task {LIM} 'charge_quota', "
        f"task {LIM} 'generate_report', task {LIM} 'upload_file'",
    )


def test_an_attempt_that_starts_as_another_ends_does_not_overlap_it(run):
    extra_starts(run, [40.0, 40.1], took=0.5)
    extra_starts(run, [40.5], took=0.5)

    assert violations(run, "concurrency_within_limit") == ()


def test_more_starts_in_a_rate_window_than_the_rate_allows_is_caught(run):
    """One run: its claim at 50.0 s, then six step boundaries, each taking its permit after the step before."""
    extra_starts(run, [50.0, 50.1, 50.2, 50.3, 50.4, 50.5, 50.6], token=20)

    assert failing(run) == {"rate_within_limit"}
    assert violations(run, "rate_within_limit") == (
        f"{LIMITED}: 6 step starts up to {at(50.6)} whose permits all fell within 0.590 s, at most 5 per 1 s",
    )


def test_a_claims_permit_may_have_been_taken_before_its_start(run):
    """Six starts within 0.5 s: two of them claims, whose permits may be up to CLAIM_SLACK_SECONDS older."""
    extra_starts(run, [50.0, 50.1, 50.2], token=20)
    extra_starts(run, [50.3, 50.4, 50.5], token=21)

    assert violations(run, "rate_within_limit") == ()


def test_boundary_starts_a_window_apart_hold_the_rate(run):
    extra_starts(run, [50.0, 50.25, 50.5, 50.75, 51.0, 51.011, 51.3], token=20)

    assert violations(run, "rate_within_limit") == ()


def test_pipelines_without_limits_are_not_judged_for_them(run):
    run["meta"]["policies"][LIMITED].update(max_concurrency=None, rate_limit=None)
    extra_starts(run, [40.0, 40.01, 40.02, 40.03, 40.04, 40.05], took=0.5)

    assert failing(run) == set()
    checked = {result.name: result.checked for result in check(run)}
    assert checked["concurrency_within_limit"] == checked["rate_within_limit"] == 0


# --- structure and reporting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("cancels"), "the record: missing 'cancels'"),
        (lambda r: r["attempts"][0].update(started_at="yesterday"), "attempts[0].started_at: expected an ISO 8601"),
        (
            lambda r: r["tasks"][-1].update(cancel_requested_at="2026-12-01T10:00:00"),
            f"tasks[{len(valid_run()['tasks']) + 3}].cancel_requested_at: expected an ISO 8601 time with its offset",
        ),
        (lambda r: r["controls"][0].update(action="stop"), "controls[0].action: expected one of pause, resume"),
        (lambda r: r["ledger"][0].update(status="gone"), "ledger[0].status: expected one of compensated, done"),
        (lambda r: r["cancels"][0].update(repeat="no"), "cancels[0].repeat: expected true or false"),
        (
            lambda r: r["meta"]["policies"][LIMITED]["rate_limit"].update(count=0),
            f"meta.policies.{LIMITED}.rate_limit: must allow at least 1 start",
        ),
        (lambda r: r["meta"]["policies"][LIMITED].pop("on_cancel"), f"meta.policies.{LIMITED}: missing 'on_cancel'"),
        (lambda r: r["meta"]["platform_pipelines"].append(3), "meta.platform_pipelines[2]: expected a string"),
    ],
)
def test_a_structurally_invalid_live_record_is_refused_in_one_readable_line(run, change, message):
    change(run)

    with pytest.raises(RecordError) as raised:
        validate_record(run)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def table_row(table: str, name: str) -> list[str]:
    return next(line.rsplit(None, 1) for line in table.splitlines() if line.startswith(name + " "))


def test_the_table_shows_what_the_client_and_the_operator_did(run):
    run["controls"][0]["at"] = 3.25
    table = format_table(run, check(run))

    assert table.index("fault injected") < table.index("live control") < table.index("invariant ")
    assert table_row(table, "cancels answered 202 (under way)") == ["cancels answered 202 (under way)", "1"]
    assert table_row(table, "cancels answered 200 (cancelled)") == ["cancels answered 200 (cancelled)", "1"]
    assert table_row(table, "cancels answered 409 (finished)") == ["cancels answered 409 (finished)", "1"]
    assert table_row(table, "cancels sent again (same cancel)") == ["cancels sent again (same cancel)", "1"]
    assert table_row(table, "cancel found the task mid-step") == ["cancel found the task mid-step", "1"]
    assert table_row(table, "cancel found the task before its first step")[1] == "1"
    assert table_row(table, "step attempts interrupted by a cancel")[1] == "1"
    assert f"pause of {LIMITED} at 3.2 s" in table and f"resume of {LIMITED} " in table


def test_a_run_without_live_control_shows_no_such_table():
    record = valid_run()

    assert "live control" not in format_table(record, check(record))
