"""The checker on waits: a valid run with approvals and sleeps holds; each breakage is caught.

The run is ``test_chaos_invariants.valid_run`` plus the campaign's approval pipeline (the report's charge, a
wait for ``manager_approval``, a sleep ``cool_off``, the report's three other steps) and three tasks of it.
Times are seconds after NOW_MS.

t-approved: a yes stored at 40.5 s (sent again with the same key: the same answer; then a no under another
key: 409), resumed at 40.6 s, slept until 41.0 s, succeeded.
t-rejected: a no stored at 50.5 s; its report step refused at 51.05 s and the charge was refunded.
t-timeout: no decision; its wait gave up at 68.1 s (signal_timeout) and the charge was refunded; a decision
sent after that was refused (409 task_finished).
"""

from __future__ import annotations

import copy

import pytest

from chaos.invariants import RecordError, check, validate_record
from chaos.wait_invariants import COMMIT_SLACK_SECONDS
from tests.unit.test_chaos_control_invariants import api_time, succeeded_effects, timed_call
from tests.unit.test_chaos_invariants import (
    ALL_INVARIANTS,
    at,
    attempt,
    failing,
    key,
    ledger,
    policy,
    submission,
    valid_run,
    violations,
)
from tests.unit.test_chaos_invariants import task as task_row

APPROVAL = "report_approved"
WAIT, SLEEP = "manager_approval", "cool_off"
STEPS = ["charge_quota", WAIT, SLEEP, "generate_report", "upload_file", "notify_user"]
APPROVED, REJECTED, TIMED_OUT = "t-approved", "t-rejected", "t-timeout"
YES = {"approved": True, "by": "chaos-manager", "reason": "approved"}
NO = {"approved": False, "by": "chaos-manager", "reason": "rejected"}


def sent(request_id, task_id, role, payload, status, received=None, code=None):
    return {
        "request_id": request_id,
        "task_id": task_id,
        "name": WAIT,
        "role": role,
        "payload": payload,
        "status": status,
        "code": code,
        "received_at": at(received) if received is not None else None,
        "sent_at": at(0),
        "error": "",
    }


def stored(task_id, payload, received):
    return {"task_id": task_id, "name": WAIT, "payload": payload, "received_at": at(received)}


def checkpoint(task_id, step_name, output, created):
    return {
        "task_id": task_id,
        "step_index": STEPS.index(step_name),
        "step_name": step_name,
        "output": output,
        "created_at": at(created),
    }


def refunded(record, task_id, charge_id, seq, when):
    record["platform"]["charges"][charge_id] = {"user_id": "u", "units": 1, "refunded": True, "task_id": task_id}
    record["ledger"].append(ledger(task_id, "charge_quota", "charge", "compensated"))
    record["calls"].append(
        {
            **timed_call(
                seq,
                when,
                "POST",
                f"/v1/quota/charges/{charge_id}/refund",
                task_id,
                key(task_id, "charge_quota", "refund"),
                {},
                200,
                "refund",
                effect=True,
            ),
            "deadline_ms": None,  # these tasks have no deadline
        }
    )


def waits_run() -> dict:
    record = valid_run()
    meta = record["meta"]
    meta["platform_pipelines"] = ["report", APPROVAL]
    meta["policies"][APPROVAL] = {**policy(), "steps": list(STEPS), "waits": [WAIT], "sleeps": [SLEEP]}
    record["tasks"] += [
        task_row(APPROVED, "succeeded", "sub-approved", pipeline=APPROVAL),
        task_row(REJECTED, "compensated", "sub-rejected", pipeline=APPROVAL, code="approval_rejected"),
        task_row(TIMED_OUT, "compensated", "sub-timeout", pipeline=APPROVAL, code="signal_timeout"),
    ]
    record["submissions"] += [
        submission("r-approved", APPROVED, "sub-approved"),
        submission("r-rejected", REJECTED, "sub-rejected"),
        submission("r-timeout", TIMED_OUT, "sub-timeout"),
    ]
    record["attempts"] += [
        attempt(APPROVED, 0, "charge_quota", 1, "succeeded", start=40.0),
        attempt(APPROVED, 1, WAIT, 1, "succeeded", start=40.6, took=0.005),
        attempt(APPROVED, 2, SLEEP, 1, "succeeded", start=41.0, took=0.005),
        attempt(APPROVED, 3, "generate_report", 1, "succeeded", start=41.05),
        attempt(APPROVED, 4, "upload_file", 1, "succeeded", start=41.15),
        attempt(APPROVED, 5, "notify_user", 1, "succeeded", start=41.25),
        attempt(REJECTED, 0, "charge_quota", 1, "succeeded", start=50.0),
        attempt(REJECTED, 1, WAIT, 1, "succeeded", start=50.6, took=0.005),
        attempt(REJECTED, 2, SLEEP, 1, "succeeded", start=51.0, took=0.005),
        attempt(REJECTED, 3, "generate_report", 1, "permanent_error", start=51.05, took=0.001),
        attempt(REJECTED, 0, "charge_quota", 1, "succeeded", kind="compensation", start=51.1),
        attempt(TIMED_OUT, 0, "charge_quota", 1, "succeeded", start=60.0),
        attempt(TIMED_OUT, 1, WAIT, 1, "permanent_error", start=68.1, took=0.001),
        attempt(TIMED_OUT, 0, "charge_quota", 1, "succeeded", kind="compensation", start=68.2),
    ]
    succeeded_effects(record, APPROVED, "ch_000040")
    refunded(record, REJECTED, "ch_000050", 50, 51.15)
    refunded(record, TIMED_OUT, "ch_000060", 60, 68.25)
    record["dlq_items"] += [
        {"task_id": REJECTED, "status": "compensated", "reason_code": "approval_rejected"},
        {"task_id": TIMED_OUT, "status": "compensated", "reason_code": "signal_timeout"},
    ]
    record["signals_sent"] = [
        sent("1-signal-first", APPROVED, "first", YES, 202, received=40.5),
        sent("1-signal-repeat", APPROVED, "repeat", YES, 202, received=40.5),
        sent("1-signal-conflict", APPROVED, "conflict", NO, 409, code="signal_already_received"),
        sent("2-signal-first", REJECTED, "first", NO, 202, received=50.5),
        sent("3-signal-first", TIMED_OUT, "first", YES, 409, code="task_finished"),
    ]
    record["signals"] = [stored(APPROVED, YES, 40.5), stored(REJECTED, NO, 50.5)]
    record["wait_checkpoints"] = [
        checkpoint(APPROVED, WAIT, YES, 40.605),
        checkpoint(APPROVED, SLEEP, {"slept_until": at(41.0)}, 41.005),
        checkpoint(REJECTED, WAIT, NO, 50.605),
        checkpoint(REJECTED, SLEEP, {"slept_until": at(51.0)}, 51.005),
    ]
    return record


@pytest.fixture
def run() -> dict:
    return copy.deepcopy(waits_run())


def first(record, section, **match):
    return next(item for item in record[section] if all(item[k] == v for k, v in match.items()))


def test_a_run_with_approvals_and_sleeps_holds_every_invariant(run):
    results = check(run)

    assert [result.name for result in results] == ALL_INVARIANTS
    assert failing(run) == set()
    checked = {result.name: result.checked for result in results}
    # signals sent or stored (by task and name), wait and sleep checkpoints, finished tasks that wait
    waits = ["signal_consumed_once", "no_early_resume", "waits_end_as_decided"]
    assert [checked[name] for name in waits] == [3, 4, 3]


def test_an_accepted_signal_that_was_not_stored_is_lost_and_its_task_resumed_without_it(run):
    run["signals"] = [row for row in run["signals"] if row["task_id"] != APPROVED]

    found = violations(run, "signal_consumed_once")
    assert (
        f"task {APPROVED}: signal 'manager_approval' (first, request 1-signal-first): accepted (202) but not "
        "stored: a lost signal" in found
    )
    assert f"task {APPROVED}: went past its wait 'manager_approval' with no signal stored" in found


def test_a_different_decision_accepted_is_caught(run):
    first(run, "signals_sent", request_id="1-signal-conflict").update(status=202, received_at=at(40.5), code=None)

    assert violations(run, "signal_consumed_once") == (
        f"task {APPROVED}: signal 'manager_approval' (conflict, request 1-signal-conflict): a different payload was "
        "accepted, expected 409 signal_already_received",
    )


def test_a_repeat_answered_with_another_signal_or_a_stored_payload_not_sent_is_caught(run):
    first(run, "signals_sent", request_id="1-signal-repeat")["received_at"] = at(40.7)
    first(run, "signals", task_id=REJECTED)["payload"] = YES

    found = violations(run, "signal_consumed_once")
    assert any("1-signal-repeat): answered received_at" in v for v in found)
    assert any(f"task {REJECTED}: signal 'manager_approval' (first" in v and "stored payload" in v for v in found)
    assert any(f"task {REJECTED}: its wait 'manager_approval' recorded" in v for v in found)


def test_an_answer_to_the_millisecond_names_the_stored_signal(run):
    first(run, "signals", task_id=APPROVED)["received_at"] = at(40.5004)
    first(run, "signals_sent", request_id="1-signal-first")["received_at"] = api_time(40.5004)  # "…:40.500Z"
    assert violations(run, "signal_consumed_once") == ()

    first(run, "signals_sent", request_id="1-signal-first")["received_at"] = api_time(40.502)
    assert len(violations(run, "signal_consumed_once")) == 1


def test_a_signal_stored_twice_is_caught(run):
    run["signals"].append(stored(APPROVED, YES, 40.9))

    assert f"task {APPROVED}: signal 'manager_approval' stored 2 times" in violations(run, "signal_consumed_once")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda run: first(run, "wait_checkpoints", task_id=APPROVED, step_name=WAIT).update(created_at=at(40.4)),
            f"task {APPROVED}: 'manager_approval' checkpointed at {at(40.4)}, but its signal 'manager_approval' came "
            f"at {at(40.5)}",
        ),
        (
            lambda run: first(run, "attempts", task_id=REJECTED, step_name=SLEEP).update(started_at=at(50.45)),
            f"task {REJECTED}: step 'cool_off' started at {at(50.45)}, but its signal 'manager_approval' came at "
            f"{at(50.5)}",
        ),
        (
            lambda run: first(run, "wait_checkpoints", task_id=APPROVED, step_name=SLEEP).update(created_at=at(40.9)),
            f"task {APPROVED}: 'cool_off' checkpointed at {at(40.9)}, but its sleep 'cool_off' lasted until {at(41.0)}",
        ),
        (
            lambda run: first(run, "attempts", task_id=APPROVED, step_name="generate_report").update(
                started_at=at(40.99)
            ),
            f"task {APPROVED}: step 'generate_report' started at {at(40.99)}, but its sleep 'cool_off' lasted until "
            f"{at(41.0)}",
        ),
        (
            lambda run: first(run, "wait_checkpoints", task_id=APPROVED, step_name=SLEEP).update(output={}),
            f"task {APPROVED}: its sleep 'cool_off' recorded no slept_until",
        ),
    ],
)
def test_a_task_resumed_before_its_signal_or_its_time_is_caught(run, change, expected):
    change(run)

    assert expected in violations(run, "no_early_resume")


def test_an_earlier_generations_steps_are_not_judged_by_the_current_ones_sleep(run):
    first(run, "tasks", id=APPROVED)["generation"] = 1
    for item in run["attempts"]:
        if item["task_id"] == APPROVED:
            item["generation"] = 1
    run["attempts"].append(attempt(APPROVED, 3, "generate_report", 1, "succeeded", start=30.0))  # generation 0

    assert violations(run, "no_early_resume") == ()


def test_a_rejected_task_that_made_a_report_or_succeeded_is_caught(run):
    run["platform"]["reports"].append({"report_id": "rep-x", "user_id": "u", "topic": "t", "task_id": REJECTED})

    assert violations(run, "waits_end_as_decided") == (
        f"task {REJECTED}: 'manager_approval' said no, yet it is compensated with 1 reports",
    )


def test_a_succeeded_task_without_a_yes_or_without_passing_its_sleep_is_caught(run):
    run["wait_checkpoints"] = [
        c for c in run["wait_checkpoints"] if (c["task_id"], c["step_name"]) != (APPROVED, SLEEP)
    ]
    first(run, "signals", task_id=APPROVED)["payload"] = {**YES, "approved": "yes"}
    first(run, "wait_checkpoints", task_id=APPROVED, step_name=WAIT)["output"] = {**YES, "approved": "yes"}

    assert set(violations(run, "waits_end_as_decided")) == {
        f"task {APPROVED}: succeeded without passing cool_off",
        f"task {APPROVED}: succeeded without a yes for manager_approval",
    }


def test_a_wait_that_timed_out_with_its_signal_stored_before_lost_it(run):
    run["signals"].append(stored(TIMED_OUT, YES, 68.1 - COMMIT_SLACK_SECONDS - 0.01))
    assert violations(run, "waits_end_as_decided") == (
        f"task {TIMED_OUT}: its wait 'manager_approval' timed out at {at(68.1)}, but its signal was stored at "
        f"{at(68.1 - COMMIT_SLACK_SECONDS - 0.01)}",
    )

    # Stored a moment before the wait looked (its row not yet committed): not lost.
    first(run, "signals", task_id=TIMED_OUT)["received_at"] = at(68.1 - COMMIT_SLACK_SECONDS + 0.01)
    assert violations(run, "waits_end_as_decided") == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda run: run["signals_sent"][0].update(role="second"),
            "signals_sent[0].role: expected one of conflict, first, repeat, got 'second'",
        ),
        (
            lambda run: run["signals"][0].update(received_at="yesterday"),
            "signals[0].received_at: expected an ISO 8601 time with its offset, got 'yesterday'",
        ),
        (lambda run: run["wait_checkpoints"][0].pop("created_at"), "wait_checkpoints[0]: missing 'created_at'"),
        (lambda run: run.update(signals={}), "signals: expected a list, got {}"),
        (
            lambda run: run["meta"]["policies"][APPROVAL].update(waits="manager_approval"),
            "meta.policies.report_approved.waits: expected a list of step names, got 'manager_approval'",
        ),
    ],
)
def test_a_malformed_wait_section_is_refused_in_one_readable_line(run, change, message):
    change(run)

    with pytest.raises(RecordError) as raised:
        validate_record(run)
    assert str(raised.value) == message
