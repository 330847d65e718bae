"""The invariant checker of recorded chaos runs: a valid run holds, each kind of breakage is caught."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chaos import record as record_format
from chaos.invariants import RecordError, check, fault_summary, format_table, validate_record

ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 1_700_000_000_000
DEADLINE_MS = NOW_MS + 60_000
OK, NO_QUOTA, LATE, ECHO = "t-succeeded", "t-no-quota", "t-deadline", "t-echo"
REPORT_TEXT = "Report on latency: no anomalies were detected for u-ann."
ALL_INVARIANTS = [
    "all_terminal",
    "one_task_per_key",
    "succeeded_effects_once",
    "failed_compensated",
    "no_duplicate_charge",
    "no_refund_without_charge",
    "no_late_calls",
    "no_key_reuse",
    "attempts_within_policy",
    "cancelled_compensated",
    "nothing_after_cancel",
    "cancel_answers",
    "nothing_started_while_paused",
    "concurrency_within_limit",
    "rate_within_limit",
    "signal_consumed_once",
    "no_early_resume",
    "waits_end_as_decided",
    "one_task_per_slot",
    "slots_accounted",
]
REPORT_STEPS = ["charge_quota", "generate_report", "upload_file", "notify_user"]


def key(task_id: str, step: str, effect: str, generation: int = 0) -> str:
    return f"rc-{task_id}-g{generation}-{step}-{effect}"


def at(seconds: float) -> str:
    """The recorded time ``seconds`` after NOW_MS (ISO 8601 with its offset, as the campaign records it)."""
    return datetime.fromtimestamp(NOW_MS / 1000 + seconds, UTC).isoformat()


def policy(**limits) -> dict:
    """The report pipeline's policy as recorded; ``limits``: max_concurrency, rate_limit (count, seconds)."""
    rate = limits.get("rate_limit")
    return {
        "steps": list(REPORT_STEPS),
        "max_attempts": 5,
        "compensation_max_attempts": 5,
        "compensated_steps": ["charge_quota", "upload_file"],
        "on_cancel": "compensate",
        "max_concurrency": limits.get("max_concurrency"),
        "rate_limit": {"count": rate[0], "window_seconds": rate[1]} if rate else None,
    }


def call(seq, method, path, task_id, idempotency_key, body, status, kind, *, effect, fault=None, replayed=False):
    return {
        "seq": seq,
        "method": method,
        "path": path,
        "task_id": task_id,
        "idempotency_key": idempotency_key,
        "deadline_ms": DEADLINE_MS,
        "received_ms": NOW_MS + seq * 100,
        "status": status,
        "replayed": replayed,
        "effect": effect,
        "fault": fault,
        "late": False,
        "body": body,
        "kind": kind,
    }


def attempt(
    task_id, step_index, step_name, number, outcome, kind="step", generation=0, *, start=None, took=0.05, token=1
):
    """An attempt row; ``start``: seconds after NOW_MS (None: not known, as for a crashed attempt)."""
    return {
        "task_id": task_id,
        "kind": kind,
        "generation": generation,
        "step_index": step_index,
        "step_name": step_name,
        "attempt": number,
        "outcome": outcome,
        "fencing_token": token,
        "started_at": at(start) if start is not None else None,
        "finished_at": at(start + took) if start is not None else None,
    }


def ledger(task_id, step_name, effect_name, status="done", generation=0):
    return {
        "task_id": task_id,
        "generation": generation,
        "step_name": step_name,
        "effect_name": effect_name,
        "effect_key": key(task_id, step_name, effect_name, generation),
        "status": status,
    }


def submission(request_id, task_id, idempotency_key, status=201, replayed=False):
    body = {"pipeline": "report", "input": {"user_id": "u", "topic": "t"}}
    return {
        "request_id": request_id,
        "idempotency_key": idempotency_key,
        "body": body,
        "status": status,
        "task_id": task_id,
        "replayed": replayed,
        "deadline": None,
    }


def task(task_id, state, idempotency_key, pipeline="report", generation=0, reason="", code="", cancel_at=None):
    return {
        "id": task_id,
        "pipeline": pipeline,
        "state": state,
        "input": {"user_id": "u", "topic": "t"},
        "generation": generation,
        "idempotency_key": idempotency_key,
        "failure_reason": reason,
        "failure_code": code,
        "deadline": None,
        "cancel_requested_at": at(cancel_at) if cancel_at is not None else None,
        "cancel_requested_by": "client:chaos" if cancel_at is not None else "",
    }


def valid_run() -> dict:
    """Four tasks, consistent across every section.

    t-succeeded: a 503 on generate_report, then a retry; a worker was SIGKILLed during upload_file; submitted
    twice at once with one key. t-no-quota: refused with 402, nothing charged, then told the user.
    t-deadline: its deadline passed before notify_user, so its file was deleted and its charge refunded.
    t-echo: another pipeline, with no platform effects.
    """
    ann, broke, cy = ({"user_id": user, "units": 1} for user in ("u-ann", "u-broke", "u-cy"))
    ann_topic, cy_topic = {"user_id": "u-ann", "topic": "latency"}, {"user_id": "u-cy", "topic": "cost"}
    ann_ready = {"user_id": "u-ann", "message": "ready"}
    broke_failed, cy_failed = ({"user_id": user, "message": "failed"} for user in ("u-broke", "u-cy"))
    ok_file, late_file = f"/v1/files/report-{OK}-g0.txt", f"/v1/files/report-{LATE}-g0.txt"
    charges, reports, notices = "/v1/quota/charges", "/v1/reports", "/v1/notifications"
    rows = [
        # task, method, path, step, effect name, body, status, call kind, took effect, injected fault
        (OK, "POST", charges, "charge_quota", "charge", ann, 201, "charge", True, None),
        (OK, "POST", reports, "generate_report", "report", ann_topic, 503, "report", False, "503"),
        (OK, "POST", reports, "generate_report", "report", ann_topic, 200, "report", True, None),
        (OK, "PUT", ok_file, "upload_file", "file", {"content": REPORT_TEXT}, 201, "file_put", True, None),
        (OK, "POST", notices, "notify_user", "notification", ann_ready, 202, "notification", True, None),
        (NO_QUOTA, "POST", charges, "charge_quota", "charge", broke, 402, "charge", False, None),
        (NO_QUOTA, "POST", notices, "on_failure", "notification", broke_failed, 202, "notification", True, None),
        (LATE, "POST", charges, "charge_quota", "charge", cy, 201, "charge", True, None),
        (LATE, "POST", reports, "generate_report", "report", cy_topic, 200, "report", True, None),
        (LATE, "PUT", late_file, "upload_file", "file", {"content": "Report on cost"}, 201, "file_put", True, None),
        (LATE, "DELETE", late_file, "upload_file", "delete", None, 204, "file_delete", True, None),
        (LATE, "POST", f"{charges}/ch_000006/refund", "charge_quota", "refund", {}, 200, "refund", True, None),
        (LATE, "POST", notices, "on_failure", "notification", cy_failed, 202, "notification", True, None),
    ]
    calls = [
        call(seq, method, path, task_id, key(task_id, step, name), body, status, kind, effect=effect, fault=fault)
        for seq, (task_id, method, path, step, name, body, status, kind, effect, fault) in enumerate(rows, start=1)
    ]
    return {
        "meta": {
            "seed": 7,
            "tasks": 4,
            "workers": 2,
            "max_crashes": 3,
            "platform_pipelines": ["report"],
            "policies": {"report": policy()},
        },
        "faults": [{"kind": "sigkill_worker", "at": 1.5, "detail": "worker 2 (pid 4242)"}],
        "controls": [],
        "submissions": [
            submission("r-1", OK, "sub-1"),
            submission("r-2", OK, "sub-1", replayed=True),
            submission("r-3", NO_QUOTA, "sub-2"),
            submission("r-4", LATE, "sub-3"),
            submission("r-5", ECHO, None),
            submission("r-6", None, "sub-4", status=0),  # no answer: the API was down
        ],
        "cancels": [],
        "tasks": [
            task(OK, "succeeded", "sub-1"),
            task(NO_QUOTA, "compensated", "sub-2", reason="permanent_error", code="insufficient_quota"),
            task(LATE, "compensated", "sub-3", reason="deadline_exceeded", code="deadline_exceeded"),
            task(ECHO, "succeeded", None, pipeline="echo"),
        ],
        "dlq_items": [
            {"task_id": NO_QUOTA, "status": "compensated", "reason_code": "permanent_error"},
            {"task_id": LATE, "status": "compensated", "reason_code": "deadline_exceeded"},
        ],
        "attempts": [
            attempt(OK, 0, "charge_quota", 1, "succeeded", start=0.05),
            attempt(OK, 1, "generate_report", 1, "transient_error", start=0.15),
            attempt(OK, 1, "generate_report", 2, "succeeded", start=0.25, token=2),
            attempt(OK, 2, "upload_file", 1, "crashed", token=2),
            attempt(OK, 2, "upload_file", 2, "succeeded", start=0.35, token=4),
            attempt(OK, 3, "notify_user", 1, "succeeded", start=0.45, token=4),
            attempt(NO_QUOTA, 0, "charge_quota", 1, "permanent_error", start=0.55),
            attempt(NO_QUOTA, -1, "on_failure", 1, "succeeded", kind="failure_notice", start=0.65),
            attempt(LATE, 0, "charge_quota", 1, "succeeded", start=0.75),
            attempt(LATE, 1, "generate_report", 1, "succeeded", start=0.85),
            attempt(LATE, 2, "upload_file", 1, "succeeded", start=0.95),
            attempt(LATE, 2, "upload_file", 1, "succeeded", kind="compensation", start=1.05),
            attempt(LATE, 0, "charge_quota", 1, "succeeded", kind="compensation", start=1.15),
            attempt(LATE, -1, "on_failure", 1, "succeeded", kind="failure_notice", start=1.25),
            attempt(ECHO, 0, "echo", 1, "succeeded", start=1.35),
        ],
        "ledger": [
            ledger(OK, "charge_quota", "charge"),
            ledger(OK, "generate_report", "report"),
            ledger(OK, "upload_file", "file"),
            ledger(OK, "notify_user", "notification"),
            ledger(LATE, "charge_quota", "charge", "compensated"),
            ledger(LATE, "generate_report", "report"),
            ledger(LATE, "upload_file", "file", "compensated"),
        ],
        "calls": calls,
        "platform": {
            "initial_balance": 100,
            "balances": {"u-ann": 99, "u-cy": 100},
            "charges": {
                "ch_000001": {"user_id": "u-ann", "units": 1, "refunded": False, "task_id": OK},
                "ch_000006": {"user_id": "u-cy", "units": 1, "refunded": True, "task_id": LATE},
            },
            "files": {f"report-{OK}-g0.txt": {"content": REPORT_TEXT, "task_id": OK}},
            "notifications": [
                {"notification_id": "ntf_000004", "user_id": "u-ann", "message": "ready", "task_id": OK},
                {"notification_id": "ntf_000005", "user_id": "u-broke", "message": "failed", "task_id": NO_QUOTA},
                {"notification_id": "ntf_000009", "user_id": "u-cy", "message": "failed", "task_id": LATE},
            ],
            "reports": [
                {"report_id": "rep_000002", "user_id": "u-ann", "topic": "latency", "text": REPORT_TEXT, "task_id": OK},
                {
                    "report_id": "rep_000007",
                    "user_id": "u-cy",
                    "topic": "cost",
                    "text": "Report on cost",
                    "task_id": LATE,
                },
            ],
        },
    }


@pytest.fixture
def run() -> dict:
    return copy.deepcopy(valid_run())


def failing(record: dict) -> set[str]:
    return {result.name for result in check(record) if not result.holds}


def violations(record: dict, name: str) -> tuple[str, ...]:
    return next(result.violations for result in check(record) if result.name == name)


def next_call(record: dict, **fields) -> dict:
    base = call(len(record["calls"]) + 1, "POST", "/v1/reports", OK, "k", {}, 200, "report", effect=False)
    record["calls"].append({**base, **fields})
    return record["calls"][-1]


# --- a valid run ----------------------------------------------------------------------------------------------------


def test_a_valid_run_holds_every_invariant_and_counts_what_it_checked(run):
    results = check(run)

    assert [result.name for result in results] == ALL_INVARIANTS
    assert [result.violations for result in results] == [()] * len(ALL_INVARIANTS)
    assert all(result.holds and result.description for result in results)
    # accepted submissions, keys, succeeded report tasks, failed report tasks, charged tasks,
    # refunds with an effect, calls, platform keys, report task generations; no cancel, pause, limit, wait or schedule
    assert [result.checked for result in results] == [5, 3, 1, 2, 2, 1, 13, 12, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def test_a_run_recorded_from_the_real_simulator_holds():
    from tasks.demo.platform_simulator import ReportPlatformSimulator, SimulatorConfig

    simulator = ReportPlatformSimulator(SimulatorConfig(insufficient_users=frozenset({"u-broke"}))).start()
    try:
        simulator.set_faults(rules=[{"method": "POST", "path_prefix": "/v1/reports", "status": 503}])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def send(method, path, task_id, idempotency_key, body=None) -> int:
            data = json.dumps(body).encode() if body is not None else None
            request = urllib.request.Request(simulator.url + path, data=data, method=method)
            request.add_header("Content-Type", "application/json")
            request.add_header("X-Task-Id", task_id)
            request.add_header("X-Request-Deadline", str(int(time.time() * 1000) + 60_000))
            request.add_header("Idempotency-Key", idempotency_key)
            try:
                with opener.open(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                exc.close()
                return exc.code

        ann, broke = {"user_id": "u-ann", "topic": "latency"}, {"user_id": "u-broke"}
        ok_file, notice = f"/v1/files/report-{OK}-g0.txt", {**broke, "message": "m"}
        statuses = [
            send("POST", "/v1/quota/charges", OK, key(OK, "charge_quota", "charge"), {**ann, "units": 1}),
            send("POST", "/v1/reports", OK, key(OK, "generate_report", "report"), ann),
            send("POST", "/v1/reports", OK, key(OK, "generate_report", "report"), ann),
            send("PUT", ok_file, OK, key(OK, "upload_file", "file"), {"content": "text"}),
            send("POST", "/v1/notifications", OK, key(OK, "notify_user", "notification"), {**ann, "message": "m"}),
            send("POST", "/v1/quota/charges", NO_QUOTA, key(NO_QUOTA, "charge_quota", "charge"), {**broke, "units": 1}),
            send("POST", "/v1/notifications", NO_QUOTA, key(NO_QUOTA, "on_failure", "notification"), notice),
        ]
        assert statuses == [201, 503, 200, 201, 202, 402, 202]
        record = valid_run()
        record["tasks"] = [task for task in record["tasks"] if task["id"] in (OK, NO_QUOTA)]
        record["submissions"] = [s for s in record["submissions"] if s["task_id"] in (OK, NO_QUOTA)]
        record["dlq_items"] = [item for item in record["dlq_items"] if item["task_id"] == NO_QUOTA]
        record["attempts"] = [a for a in record["attempts"] if a["task_id"] in (OK, NO_QUOTA)]
        record["calls"] = simulator.calls()
        record["platform"] = simulator.state()
    finally:
        simulator.stop()

    assert failing(record) == set()
    assert ("platform scripted:503", 1) in fault_summary(record)
    assert ("platform 402 insufficient quota", 1) in fault_summary(record)


def test_the_copied_states_and_outcomes_are_the_engines():
    from tasks.models import (
        TERMINAL_STATES,
        UNRESOLVED_STATUSES,
        AttemptKind,
        AttemptOutcome,
        DLQStatus,
        EffectStatus,
        FailureReason,
        TaskState,
    )

    assert record_format.TASK_STATES == set(TaskState.values)
    assert record_format.TERMINAL_STATES == set(TERMINAL_STATES)
    assert record_format.DLQ_STATUSES == set(DLQStatus.values)
    assert record_format.UNRESOLVED_DLQ_STATUSES == set(UNRESOLVED_STATUSES)
    assert record_format.ATTEMPT_KINDS == set(AttemptKind.values)
    assert record_format.ATTEMPT_OUTCOMES == set(AttemptOutcome.values)
    assert record_format.EFFECT_STATUSES == set(EffectStatus.values)
    assert record_format.CANCELLED_REASON == FailureReason.CANCELLED
    assert record_format.NOT_SUCCEEDED_STATES == set(TERMINAL_STATES) - {TaskState.SUCCEEDED, TaskState.CANCELLED}


def test_the_checker_and_its_command_line_import_no_django():
    code = (
        "import sys, chaos.check\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'django')\n"
        "sys.exit(f'imported {loaded}' if loaded else 0)"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert completed.returncode == 0, completed.stderr


# --- each kind of breakage ------------------------------------------------------------------------------------------


def test_a_second_charge_of_a_compensated_task_is_a_duplicate(run):
    run["platform"]["charges"]["ch_000010"] = {"user_id": "u-cy", "units": 1, "refunded": True, "task_id": LATE}

    assert failing(run) == {"no_duplicate_charge"}
    assert violations(run, "no_duplicate_charge") == (
        f"task {LATE}: 2 charges (ch_000006, ch_000010), expected at most 1",
    )


def test_a_second_charge_of_a_succeeded_task_is_a_duplicate_and_an_effect_twice(run):
    run["platform"]["charges"]["ch_000010"] = {"user_id": "u-ann", "units": 1, "refunded": False, "task_id": OK}

    assert failing(run) == {"no_duplicate_charge", "succeeded_effects_once"}
    assert "2 charges not refunded (ch_000001, ch_000010), expected 1" in violations(run, "succeeded_effects_once")[0]


def test_a_charge_left_unrefunded_after_compensation_is_caught(run):
    run["platform"]["charges"]["ch_000006"]["refunded"] = False
    run["calls"] = [c for c in run["calls"] if c["kind"] != "refund"]

    assert failing(run) == {"failed_compensated"}
    assert violations(run, "failed_compensated") == (f"task {LATE} (compensated): charge ch_000006 not refunded",)


def test_a_file_left_by_a_compensated_task_is_caught(run):
    run["platform"]["files"][f"report-{LATE}-g0.txt"] = {"content": "Report on cost", "task_id": LATE}

    assert failing(run) == {"failed_compensated"}
    assert f"file report-{LATE}-g0.txt left at the platform" in violations(run, "failed_compensated")[0]


def second_failure_notice(record: dict) -> None:
    """t-no-quota's notice sent again under a new key: the user is told twice."""
    body = {"user_id": "u-broke", "message": "failed"}
    notice_key = key(NO_QUOTA, "on_failure", "notification") + "-again"
    record["calls"].append(
        call(99, "POST", "/v1/notifications", NO_QUOTA, notice_key, body, 202, "notification", effect=True)
    )
    record["platform"]["notifications"].append({**record["platform"]["notifications"][1], "notification_id": "n99"})


def test_a_failed_task_may_have_sent_its_last_steps_notification_before_the_timeout(run):
    """The platform acted, the answer came after the step's time ran out: one notice still holds."""
    body = {"user_id": "u-cy", "message": "ready"}
    notify_key = key(LATE, "notify_user", "notification")
    run["calls"].append(call(99, "POST", "/v1/notifications", LATE, notify_key, body, 202, "notification", effect=True))
    run["platform"]["notifications"].append({"notification_id": "n99", "task_id": LATE, **body})
    assert failing(run) == set()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r["dlq_items"].pop(0), "0 unresolved DLQ items, expected 1"),
        (lambda r: r["dlq_items"][0].update(status="resolved"), "0 unresolved DLQ items, expected 1"),
        (lambda r: r["dlq_items"].append({**r["dlq_items"][0], "status": "open"}), "2 unresolved DLQ items"),
        (lambda r: r["dlq_items"][0].update(reason_code=""), "its DLQ item has no reason code"),
        (second_failure_notice, "2 failure notices, expected at most 1"),
    ],
    ids=["missing", "resolved", "two", "no-reason", "two-notices"],
)
def test_a_failed_task_without_exactly_one_dlq_item_or_with_two_notices_is_caught(run, change, expected):
    change(run)

    assert failing(run) == {"failed_compensated"}
    (violation,) = violations(run, "failed_compensated")
    assert violation.startswith(f"task {NO_QUOTA} (compensated): ") and expected in violation


@pytest.mark.parametrize("late_flag", [True, False], ids=["flagged-late", "received-after-deadline"])
def test_a_call_after_its_deadline_is_caught(run, late_flag):
    run["calls"][8].update(late=late_flag, received_ms=DEADLINE_MS + 250)

    assert failing(run) == {"no_late_calls"}
    assert violations(run, "no_late_calls") == (f"call seq 9: POST /v1/reports (task {LATE}) arrived 250 ms late",)


def test_an_accepted_submission_whose_task_is_missing_is_a_lost_task(run):
    run["submissions"].append(submission("r-9", "t-vanished", "sub-9"))

    assert failing(run) == {"all_terminal"}
    assert violations(run, "all_terminal") == ("task t-vanished (request r-9): lost task, no such task",)


@pytest.mark.parametrize(("task_id", "state"), [(OK, "running"), (ECHO, "queued"), (LATE, "compensating")])
def test_an_accepted_submission_whose_task_is_not_terminal_is_a_lost_task(run, task_id, state):
    next(t for t in run["tasks"] if t["id"] == task_id)["state"] = state

    assert failing(run) == {"all_terminal"}
    assert violations(run, "all_terminal")[0].endswith(f"lost task, still {state}")


def test_an_unanswered_or_refused_submission_is_not_accepted(run):
    run["submissions"].append(submission("r-10", None, "sub-10", status=503))

    assert failing(run) == set()


def test_a_platform_key_used_for_two_different_requests_is_caught_once(run):
    other = {"user_id": "u-ann", "topic": "another topic"}
    next_call(run, idempotency_key=key(OK, "generate_report", "report"), body=other, status=422)

    assert failing(run) == {"no_key_reuse"}
    assert violations(run, "no_key_reuse") == (
        f"key {key(OK, 'generate_report', 'report')}: used for 2 different requests "
        "(seq 2: POST /v1/reports; seq 14: POST /v1/reports)",
    )


def test_a_422_from_the_platform_is_a_reused_key_but_an_injected_422_is_not(run):
    next_call(run, idempotency_key="rc-first-used-before-recording", status=422, fault="scripted:422")
    assert failing(run) == set()

    next_call(run, idempotency_key="rc-first-used-before-recording", status=422)
    assert violations(run, "no_key_reuse") == (
        "call seq 15: key rc-first-used-before-recording answered 422 (key reused)",
    )


def test_accepted_submissions_of_one_key_that_got_two_tasks_are_caught(run):
    run["submissions"].append(submission("r-11", ECHO, "sub-1", replayed=True))

    assert failing(run) == {"one_task_per_key"}
    assert violations(run, "one_task_per_key") == (f"key sub-1: accepted submissions got 2 tasks ({OK}, {ECHO})",)


def test_two_task_rows_with_one_key_are_caught(run):
    next(t for t in run["tasks"] if t["id"] == ECHO)["idempotency_key"] = "sub-3"

    assert failing(run) == {"one_task_per_key"}
    assert violations(run, "one_task_per_key") == (f"key sub-3: 2 task rows carry it ({LATE}, {ECHO})",)


def test_step_tries_beyond_max_attempts_are_caught(run):
    run["attempts"] += [attempt(OK, 1, "generate_report", n, "transient_error") for n in range(3, 7)]

    assert failing(run) == {"attempts_within_policy"}
    assert violations(run, "attempts_within_policy") == (
        f"task {OK} generation 0: step 'generate_report' tried 6 times, budget 5",
    )


def test_crashes_beyond_max_crashes_are_caught(run):
    run["attempts"] += [attempt(OK, 3, "notify_user", n, "crashed") for n in range(1, 4)]

    assert failing(run) == {"attempts_within_policy"}
    assert violations(run, "attempts_within_policy") == (
        f"task {OK} generation 0: 4 crashes while running, max_crashes 3",
    )


def test_compensation_tries_get_a_fresh_budget_per_compensation_run(run):
    tries = [attempt(LATE, 0, "charge_quota", n, "transient_error", kind="compensation") for n in range(1, 6)]
    run["attempts"] += tries
    assert violations(run, "attempts_within_policy") == (
        f"task {LATE} generation 0: compensation 'charge_quota' tried 6 times, budget 5",
    )

    # A crash during compensation starts a new run, which counts its tries from 1 again.
    run["attempts"].append(attempt(LATE, -1, "(compensation)", 1, "crashed", kind="compensation"))
    assert failing(run) == set()


def test_a_compensation_after_a_crash_loop_may_crash_once_more(run):
    run["attempts"] += [attempt(LATE, 2, "upload_file", n, "crashed") for n in range(1, 4)]
    run["attempts"].append(attempt(LATE, -1, "(compensation)", 1, "crashed", kind="compensation"))
    assert failing(run) == set()

    run["attempts"].append(attempt(LATE, -1, "(compensation)", 1, "crashed", kind="compensation"))
    assert violations(run, "attempts_within_policy") == (f"task {LATE} generation 0: 5 crashes in all, budget 4",)


def test_pipelines_without_a_policy_are_not_policed(run):
    run["attempts"] += [attempt(ECHO, 0, "echo", n, "transient_error") for n in range(2, 20)]

    assert failing(run) == set()


@pytest.mark.parametrize(
    ("path", "task_id", "expected"),
    [
        (
            "/v1/quota/charges/ch_404/refund",
            LATE,
            f"call seq 14: task {LATE} refunded charge ch_404, which does not exist",
        ),
        (
            "/v1/quota/charges/ch_000006/refund",
            NO_QUOTA,
            f"call seq 14: task {NO_QUOTA} refunded charge ch_000006 of task {LATE}",
        ),
    ],
    ids=["unknown-charge", "another-tasks-charge"],
)
def test_a_refund_without_a_charge_of_its_task_is_caught(run, path, task_id, expected):
    next_call(run, path=path, task_id=task_id, idempotency_key="rc-refund", kind="refund", effect=True)

    assert failing(run) == {"no_refund_without_charge"}
    assert violations(run, "no_refund_without_charge") == (expected,)


def test_a_refund_without_effect_is_not_a_refund(run):
    next_call(run, path="/v1/quota/charges/ch_404/refund", idempotency_key="rc-r", kind="refund", status=404)

    assert failing(run) == set()


def test_a_refund_of_a_succeeded_tasks_charge_is_caught(run):
    run["platform"]["charges"]["ch_000001"]["refunded"] = True
    path = "/v1/quota/charges/ch_000001/refund"
    next_call(run, path=path, task_id=OK, idempotency_key="rc-refund", kind="refund", effect=True)

    assert failing(run) == {"no_refund_without_charge", "succeeded_effects_once"}
    assert violations(run, "no_refund_without_charge") == (f"task {OK}: succeeded, yet refunded (call seq 14)",)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r["platform"]["reports"].pop(0), "0 reports, expected 1"),
        (lambda r: r["platform"]["reports"].append({**r["platform"]["reports"][0]}), "2 reports, expected 1"),
        (lambda r: r["platform"]["notifications"].pop(0), "0 notifications, expected 1"),
        (lambda r: r["platform"]["files"].clear(), f"files (none), expected only report-{OK}-g0.txt"),
        (
            lambda r: r["platform"]["files"].update({"stray.txt": {"content": "", "task_id": OK}}),
            f"files (report-{OK}-g0.txt, stray.txt), expected only report-{OK}-g0.txt",
        ),
    ],
    ids=["no-report", "two-reports", "no-notification", "no-file", "extra-file"],
)
def test_a_succeeded_task_without_each_effect_exactly_once_is_caught(run, change, expected):
    change(run)

    assert failing(run) == {"succeeded_effects_once"}
    assert violations(run, "succeeded_effects_once") == (f"task {OK}: {expected}",)


def retried_from_start(record: dict, generation: int) -> dict:
    """t-deadline retried from the start after its compensation, then succeeded in generation 1."""
    (late,) = (t for t in record["tasks"] if t["id"] == LATE)
    late.update(state="succeeded", generation=generation)
    record["dlq_items"][1]["status"] = "resolved"
    platform = record["platform"]
    platform["charges"]["ch_000020"] = {"user_id": "u-cy", "units": 1, "refunded": False, "task_id": LATE}
    platform["reports"].append({**platform["reports"][1], "report_id": "rep_000021"})
    platform["files"][f"report-{LATE}-g1.txt"] = {"content": "Report on cost", "task_id": LATE}
    platform["notifications"].append({**platform["notifications"][2], "message": "ready"})
    return record


def test_a_task_retried_from_the_start_may_have_one_set_of_effects_per_generation(run):
    assert failing(retried_from_start(run, generation=1)) == set()


def test_the_same_effects_in_one_generation_are_caught(run):
    assert failing(retried_from_start(run, generation=0)) == {
        "succeeded_effects_once",
        "no_duplicate_charge",
        "no_refund_without_charge",
    }


# --- structure ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("tasks"), "the record: missing 'tasks'"),
        (lambda r: r.update(tasks={}), "tasks: expected a list, got {}"),
        (lambda r: r["meta"].pop("max_crashes"), "meta: missing 'max_crashes'"),
        (lambda r: r["meta"]["policies"]["report"].update(max_attempts=0), "meta.policies.report.max_attempts: must"),
        (lambda r: r["tasks"][1].update(state="lost"), "tasks[1].state: expected one of cancelled, compensated,"),
        (lambda r: r["submissions"][0].update(status="201"), "submissions[0].status: expected an integer, got '201'"),
        (lambda r: r["calls"][0].update(late=None), "calls[0].late: expected true or false, got null"),
        (lambda r: r["attempts"][2].update(attempt=True), "attempts[2].attempt: expected an integer, got true"),
        (
            lambda r: r["attempts"][2].update(outcome="exploded"),
            "attempts[2].outcome: expected one of cancelled, crashed,",
        ),
        (lambda r: r["faults"][0].update(at="soon"), "faults[0].at: expected a number, got 'soon'"),
        (lambda r: r["dlq_items"].append("open"), "dlq_items[2]: expected an object, got 'open'"),
        (lambda r: r["tasks"].append(copy.deepcopy(r["tasks"][0])), f"tasks: task {OK} is listed more than once"),
        (lambda r: r["platform"]["charges"]["ch_000001"].pop("refunded"), "platform.charges.ch_000001: missing"),
        (lambda r: r["platform"]["reports"][0].pop("task_id"), "platform.reports[0]: missing 'task_id'"),
    ],
)
def test_a_structurally_invalid_record_is_refused_in_one_readable_line(run, change, message):
    change(run)

    with pytest.raises(RecordError) as raised:
        validate_record(run)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)
    with pytest.raises(RecordError):
        check(run)


@pytest.mark.parametrize("record", [[], "run", None])
def test_a_record_that_is_not_an_object_is_refused(record):
    with pytest.raises(RecordError, match="the record: expected an object"):
        validate_record(record)


def test_a_whole_number_of_seconds_is_a_number(run):
    run["faults"][0]["at"] = 2

    validate_record(run)


# --- reporting ------------------------------------------------------------------------------------------------------


def test_the_fault_summary_counts_campaign_faults_then_platform_faults(run):
    run["faults"] += [
        {"kind": "redis_restart", "at": 4.0, "detail": ""},
        {"kind": "sigkill_worker", "at": 9.0, "detail": ""},
        {"kind": "pg_terminate_backend", "at": 9.5, "detail": "no backend", "failed": True},
    ]
    next_call(run, fault="slow")
    next_call(run, status=402, replayed=True)  # the compensation replaying a refused charge: counted once

    assert fault_summary(run) == [
        ("sigkill_worker", 2),
        ("redis_restart", 1),
        ("pg_terminate_backend (failed to inject)", 1),
        ("platform 402 insufficient quota", 1),
        ("platform 503", 1),
        ("platform slow", 1),
    ]


def table_row(table: str, name: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if line.startswith(name + " "))


def test_the_table_shows_faults_then_invariants(run):
    table = format_table(run, check(run))

    assert table.index("sigkill_worker") < table.index("all_terminal")
    assert table.count("PASS") == len(ALL_INVARIANTS) and "FAIL" not in table
    assert table_row(table, "no_late_calls") == ["no_late_calls", "13", "0", "PASS"]
    assert table.endswith(f"{len(ALL_INVARIANTS)} of {len(ALL_INVARIANTS)} invariants hold")


def test_the_table_shows_the_first_violations_of_a_failing_invariant(run):
    for call_record in run["calls"][:7]:
        call_record["late"] = True

    table = format_table(run, check(run))

    assert table_row(table, "no_late_calls") == ["no_late_calls", "13", "7", "FAIL"]
    assert "    - call seq 5: " in table and "call seq 6: " not in table
    assert "    ... and 2 more" in table
    assert table.endswith(f"{len(ALL_INVARIANTS) - 1} of {len(ALL_INVARIANTS)} invariants hold")


# --- the command line -----------------------------------------------------------------------------------------------


def run_check(path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "chaos.check", str(path)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_command_line_exits_0_when_every_invariant_holds(run, tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps(run))

    completed = run_check(path)

    assert completed.returncode == 0, completed.stderr
    assert f"{len(ALL_INVARIANTS)} of {len(ALL_INVARIANTS)} invariants hold" in completed.stdout


def test_the_command_line_exits_1_on_a_violation(run, tmp_path):
    run["platform"]["files"][f"report-{LATE}-g0.txt"] = {"content": "", "task_id": LATE}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(run))

    completed = run_check(path)

    assert completed.returncode == 1, completed.stderr
    assert "failed_compensated" in completed.stdout and "FAIL" in completed.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b'{"meta": ', "is not JSON: Expecting value at line 1, column 10"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (json.dumps({"meta": {}}).encode(), "is not a recorded run: the record: missing 'faults'"),
    ],
    ids=["missing-file", "bad-json", "not-utf8", "invalid-record"],
)
def test_the_command_line_exits_2_with_one_line_on_an_unreadable_record(tmp_path, content, message):
    path = tmp_path / "record.json"
    if content is not None:
        path.write_bytes(content)

    completed = run_check(path)

    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.count("\n") == 1 and message in completed.stderr
    assert completed.stderr.startswith("chaos.check: ")
