"""The checker on the campaign's schedule: a valid run holds; each breakage is caught.

The run is ``test_chaos_invariants.valid_run`` plus the schedule ``chaos-tick`` (every 2 s), synced at 0.7 s
(NOW_MS is on its grid): its slots at 2, 4, 6 and 10 s fired, each with its task created just after; the slot
at 8 s was missed (the sweeper stalled past its catch-up window); the campaign paused it, returning at 11 s.
Times are seconds after NOW_MS.
"""

from __future__ import annotations

import copy
import re

import pytest

from chaos.invariants import RecordError, check, format_table, validate_record
from chaos.schedule_invariants import SYNC_SLACK_SECONDS, slot_key
from tests.unit.test_chaos_invariants import ALL_INVARIANTS, at, failing, valid_run, violations
from tests.unit.test_chaos_invariants import task as task_row

NAME = "chaos-tick"
FIRED = (2.0, 4.0, 6.0, 10.0)


def tick_task(slot: float, created: float | None = None) -> dict:
    row = task_row(f"t-tick-{slot:g}", "succeeded", slot_key(NAME, at(slot)), pipeline="chaos_tick")
    row["created_at"] = at(slot + 0.01 if created is None else created)
    return row


def fired(slot: float, task_id: str | None = None, error: str = "") -> dict:
    return {"schedule": NAME, "slot_at": at(slot), "task_id": task_id, "error": error}


def schedule_run() -> dict:
    record = valid_run()
    record["tasks"] += [tick_task(slot) for slot in FIRED]
    record["schedule_runs"] = [fired(slot, f"t-tick-{slot:g}") for slot in FIRED]
    record["schedules"] = [
        {
            "name": NAME,
            "every_seconds": 2.0,
            "created_at": at(0.7),
            "last_slot_at": at(10.0),
            "paused_at": at(10.99),
            "slots_skipped": 0,
            "slots_missed": 1,
        }
    ]
    record["schedule_controls"] = [
        {"action": "pause", "schedule": NAME, "called_at": at(10.98), "returned_at": at(11.0)}
    ]
    return record


@pytest.fixture
def run() -> dict:
    return copy.deepcopy(schedule_run())


def test_a_run_with_a_schedule_holds_every_invariant(run):
    results = check(run)

    assert [result.name for result in results] == ALL_INVARIANTS
    assert failing(run) == set()
    checked = {result.name: result.checked for result in results}
    assert (checked["one_task_per_slot"], checked["slots_accounted"]) == (4, 5)  # runs; slots from 2 s to 10 s


def test_a_slot_fired_twice_is_caught_and_so_are_its_two_tasks(run):
    run["schedule_runs"].append(fired(4.0, "t-tick-4b"))
    run["tasks"].append({**tick_task(4.0), "id": "t-tick-4b"})

    found = violations(run, "one_task_per_slot")
    assert any("fired 2 times" in v for v in found)
    assert f"key {slot_key(NAME, at(4.0))}: 2 tasks (t-tick-4, t-tick-4b)" in found


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda run: run["schedule_runs"][0].update(slot_at=at(2.5)), "not on its grid of 2 s"),
        (lambda run: run["schedule_controls"][0].update(returned_at=at(9.0)), "fired after the pause returned"),
        (lambda run: run["tasks"][-1].update(created_at=at(9.9)), "before its slot"),
        (lambda run: run["schedule_runs"][1].update(task_id="t-nobody"), "its task t-nobody does not exist"),
        (lambda run: run["schedule_runs"][1].update(task_id=None), "fired without a task or an error"),
        (lambda run: run["tasks"][-1].update(idempotency_key="other"), "has the key 'other'"),
        (lambda run: run["schedule_runs"].pop(), "has no fired slot of its schedule"),
    ],
)
def test_a_slot_fired_wrong_is_caught(run, change, expected):
    change(run)

    assert any(expected in v for v in violations(run, "one_task_per_slot"))


def test_a_slot_whose_submission_was_refused_has_its_error_instead_of_a_task(run):
    run["schedule_runs"][1].update(task_id=None, error="invalid_input: no")
    run["tasks"] = [t for t in run["tasks"] if t["id"] != "t-tick-4"]

    assert violations(run, "one_task_per_slot") == ()


def test_a_slot_neither_fired_skipped_nor_counted_missed_is_caught(run):
    run["schedules"][0]["slots_missed"] = 0
    assert violations(run, "slots_accounted") == (
        f"schedule {NAME}: 5 slots from its first to {at(10.0)}, but 4 fired, 0 skipped and 0 missed",
    )

    run["schedules"][0]["slots_skipped"] = 1  # skipped for an unfinished task instead: accounted
    assert violations(run, "slots_accounted") == ()


def test_a_first_slot_within_the_sync_slack_may_have_passed_before_the_sync(run):
    run["schedules"][0]["created_at"] = at(2.0 + SYNC_SLACK_SECONDS - 0.1)  # the slot at 2 s: maybe before it
    run["schedule_runs"] = run["schedule_runs"][1:]
    run["tasks"] = [t for t in run["tasks"] if t["id"] != "t-tick-2"]
    assert violations(run, "slots_accounted") == ()

    run["schedules"][0]["created_at"] = at(2.0 + SYNC_SLACK_SECONDS + 0.1)  # after the slack: it was not
    assert violations(run, "slots_accounted") == ()
    run["schedules"][0]["slots_missed"] = 0
    assert len(violations(run, "slots_accounted")) == 1


def test_a_schedule_that_never_fired_in_a_long_run_is_caught(run):
    run["schedule_runs"], run["schedules"][0]["last_slot_at"] = [], None
    run["schedules"][0].update(slots_missed=0)
    run["tasks"] = [t for t in run["tasks"] if t["pipeline"] != "chaos_tick"]

    assert violations(run, "slots_accounted") == (f"schedule {NAME}: no slot fired between {at(0.7)} and {at(11.0)}",)


def test_a_malformed_schedule_section_is_refused_in_one_readable_line(run):
    run["schedule_controls"][0]["action"] = "resume"

    with pytest.raises(RecordError) as raised:
        validate_record(run)
    assert str(raised.value) == "schedule_controls[0].action: expected one of pause, got 'resume'"


def test_the_report_counts_the_schedules_slots_and_the_signals_answers(run):
    run["signals_sent"] = [
        {
            "request_id": "1-signal-first",
            "task_id": "t-x",
            "name": "manager_approval",
            "role": "first",
            "payload": {},
            "status": 409,
            "code": "task_finished",
            "received_at": None,
        }
    ]

    table = format_table(run, check(run))

    assert re.search(r"slots of chaos-tick fired +4\n", table)
    assert re.search(r"slots of chaos-tick missed \(outage\) +1\n", table)
    assert re.search(r"signals \(first\) answered 409 task_finished +1\n", table)
