"""Invariants of live control in a recorded run: cancels, a paused pipeline, concurrency and rate limits.

Standard library only, like ``chaos.invariants``, which runs these after its own. They compare times
that different processes read: a cancel's ``requested_at`` (the web process, once it holds the task's row
lock), an attempt's start and end (its worker), a pause's call and return (the campaign). Every process
of a campaign runs on one machine and so reads one clock; on several hosts each comparison would need the
clocks' skew as a slack.

When a step may start. A worker decides at a *gate*: the claim (for the first step of a run: a run is
one lease, one fencing token) or the write of the step before (the step boundary, which reads a cancel
of the task and a pause of its pipeline in the same statement, and takes a rate permit after it). A gate
that read the row before a cancel or a pause committed lets one more step start after it. A boundary's
gate is read after the step before it finished, so that finish time bounds it exactly. A claim's is not
recorded: the checker assumes a worker starts the run's first step within ``CLAIM_SLACK_SECONDS`` of its
claim (two round trips and a few lines of Python, some milliseconds; a worker held up longer between the
two, descheduled for a second on a loaded machine, would make an honest run fail a check). A crashed
attempt has no recorded start: it is left out of every check that needs one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

from chaos.record import (
    CANCEL_ACCEPTED_STATUSES,
    TERMINAL_STATES,
    UNRESOLVED_DLQ_STATUSES,
    RecordedRun,
    key_step,
    seconds,
)
from chaos.verdicts import Invariant, registrar

__all__ = ["CLAIM_SLACK_SECONDS", "INVARIANTS", "control_summary"]

INVARIANTS: list[Invariant] = []
_invariant = registrar(INVARIANTS)

# The longest the checker assumes between a claim's read of the gate and the start of the run's first step.
CLAIM_SLACK_SECONDS = 1.0
# Outcomes of an attempt that is followed by a retry (when the budget allows).
RETRIED_OUTCOMES = frozenset({"timeout", "transient_error"})


def _start(attempt: dict) -> float | None:
    return seconds(attempt["started_at"]) if attempt["started_at"] is not None else None


def _finish(attempt: dict) -> float | None:
    return seconds(attempt["finished_at"]) if attempt["finished_at"] is not None else None


def _steps(run: RecordedRun, task: dict) -> list[dict]:
    """The task's step attempts in its current generation, those with a start in time order first."""
    attempts = [
        a for a in run.attempts.get(task["id"], []) if a["kind"] == "step" and a["generation"] == task["generation"]
    ]
    return sorted(attempts, key=lambda a: (a["started_at"] is None, _start(a) or 0.0))


def _started(run: RecordedRun, pipeline: str) -> Iterator[tuple[dict, dict, list[dict]]]:
    """(task, step attempt, the task's steps) of every step attempt of ``pipeline`` with a recorded start."""
    for task in run.tasks.values():
        if task["pipeline"] == pipeline:
            steps = _steps(run, task)
            yield from ((task, attempt, steps) for attempt in steps if attempt["started_at"] is not None)


def _gate_read_by(attempt: dict, steps: list[dict]) -> tuple[float, str]:
    """The latest time the gate that let ``attempt`` start can have been read, and what that gate was.

    Within a run (one fencing token), the step before it finished first; a run's first step was let
    through by its claim, at most CLAIM_SLACK_SECONDS before it started.
    """
    start = _start(attempt)
    assert start is not None
    before = [
        a
        for a in steps
        if a is not attempt
        and a["fencing_token"] == attempt["fencing_token"]
        and a["finished_at"] is not None
        and _finish(a) <= start
    ]
    if before:
        previous = max(before, key=_finish)
        return _finish(previous), f"the write of step {previous['step_name']!r} (finished {previous['finished_at']})"
    return start - CLAIM_SLACK_SECONDS, f"its claim (at most {CLAIM_SLACK_SECONDS:g} s before it started)"


def _where(attempt: dict) -> str:
    return f"step {attempt['step_name']!r} attempt {attempt['attempt']} (started {attempt['started_at']})"


def _policy(run: RecordedRun, pipeline: str) -> dict | None:
    return run.record["meta"]["policies"].get(pipeline)


# --- cancels --------------------------------------------------------------------------------------------------------


@_invariant(
    "cancelled_compensated",
    "a cancelled task's charges are refunded, its file deleted, its ledger compensated, no failure notice sent, "
    "and no dead letter open unless it ended compensation_failed (then exactly one, for the cancel)",
)
def _cancelled_compensated(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    tasks = run.cancelled()
    platform = set(run.record["meta"]["platform_pipelines"])
    for task in tasks:
        task_id, problems = task["id"], []
        unresolved = [item for item in run.dlq_items.get(task_id, []) if item["status"] in UNRESOLVED_DLQ_STATUSES]
        notices = [a for a in run.attempts.get(task_id, []) if a["kind"] == "failure_notice"]
        if notices:
            problems.append(f"its failure notice ran {len(notices)} times (never for a cancel)")
        policy = _policy(run, task["pipeline"])
        if task["state"] == "compensation_failed":
            # Its dead letter is the operator's to act on; what could not be undone is said there.
            if len(unresolved) != 1:
                problems.append(f"{len(unresolved)} unresolved DLQ items, expected 1")
        elif policy is not None and policy["on_cancel"] == "park":
            pass  # its steps are left as they are, for an operator: nothing to check but the notice
        else:
            if unresolved:
                problems.append(f"{len(unresolved)} unresolved DLQ items, expected none")
            if task["pipeline"] in platform:
                problems += run.effects_left(task_id)
            compensated_steps = set(policy["compensated_steps"]) if policy else set()
            for entry in run.ledger.get(task_id, []):
                if (
                    entry["generation"] == task["generation"]
                    and entry["step_name"] in compensated_steps
                    and entry["status"] != "compensated"
                ):
                    problems.append(f"ledger: {entry['effect_key']} is {entry['status']}, not compensated")
        if problems:
            violations.append(f"task {task_id} ({task['state']}): " + "; ".join(problems))
    return len(tasks), violations


@_invariant(
    "nothing_after_cancel",
    "no step started once a task's cancel was seen (only the one its gate let through before the cancel), "
    "and no platform call under the key of a step that had not started by then",
)
def _nothing_after_cancel(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    tasks = [task for task in run.tasks.values() if task["cancel_requested_at"] is not None]
    for task in tasks:
        task_id, cancel_at = task["id"], seconds(task["cancel_requested_at"])
        steps = _steps(run, task)
        after = [a for a in steps if a["started_at"] is not None and _start(a) > cancel_at]
        where = f"task {task_id} (cancel at {task['cancel_requested_at']})"
        if len(after) > 1:
            started = ", ".join(_where(a) for a in after)
            violations.append(f"{where}: {len(after)} step attempts started after the cancel ({started})")
        if after:
            read_by, gate = _gate_read_by(after[0], steps)
            if read_by > cancel_at:
                violations.append(f"{where}: {_where(after[0])} was let through after the cancel by {gate}")
        # A step that had started (or may have: a crash hides when) by the cancel, or the one let through.
        started_steps = {a["step_name"] for a in steps if a["started_at"] is None or _start(a) <= cancel_at}
        started_steps |= {a["step_name"] for a in after[:1]}
        policy = _policy(run, task["pipeline"])
        pipeline_steps = set(policy["steps"]) if policy else set()
        for call in run.calls.get(task_id, []):
            step = key_step(call["idempotency_key"], task_id, task["generation"])
            if step in pipeline_steps and step not in started_steps:
                violations.append(
                    f"{where}: call seq {call['seq']} {call['method']} {call['path']} under the key of step "
                    f"{step!r}, which had not started by the cancel"
                )
    return len(tasks), violations


@_invariant(
    "cancel_answers",
    "every cancel of the client's own task was answered as the API promises: 200 once terminal, 202 while under "
    "way, both naming the task's one cancel; 409 only for a task finished without a cancel",
)
def _cancel_answers(run: RecordedRun) -> tuple[int, list[str]]:
    violations = []
    cancels = run.record["cancels"]
    for request in cancels:
        status, task = request["status"], run.tasks.get(request["task_id"])
        where = f"cancel {request['request_id']} of task {request['task_id']}"
        if status == 0 or status >= 500:
            continue  # no answer came (a fault): the client sent it again as far as it could
        if task is None:
            violations.append(f"{where}: answered {status}, but there is no such task")
        elif status in CANCEL_ACCEPTED_STATUSES:
            problem = _accepted_answer_problem(request, task)
            if problem:
                violations.append(f"{where}: {problem}")
        elif status == 409:
            if task["cancel_requested_at"] is not None:
                violations.append(f"{where}: refused (409) although its cancel of {task['cancel_requested_at']} holds")
            elif request["state"] not in TERMINAL_STATES | {"compensating"}:
                violations.append(f"{where}: refused (409) while the task was {request['state']}")
            elif request["state"] in TERMINAL_STATES and request["state"] != task["state"]:
                violations.append(f"{where}: refused (409) as {request['state']}, but the task ended {task['state']}")
        else:
            violations.append(f"{where}: answered {status}")
    for task in run.tasks.values():
        if task["cancel_requested_at"] is not None and task["id"] not in run.cancels:
            violations.append(f"task {task['id']}: cancelled at {task['cancel_requested_at']}, by no recorded request")
    return len(cancels), violations


def _accepted_answer_problem(request: dict, task: dict) -> str:
    status, state = request["status"], request["state"]
    if task["cancel_requested_at"] is None:
        return f"accepted ({status}), yet the task has no cancel"
    # The API shows times to the millisecond; a repeat must name the first cancel, not one of its own.
    if request["requested_at"] is None or _milliseconds(request["requested_at"]) != _milliseconds(
        task["cancel_requested_at"]
    ):
        return f"answered requested_at {request['requested_at']}, the task's cancel is {task['cancel_requested_at']}"
    if status == 200 and state not in TERMINAL_STATES:
        return f"answered 200 while the task was {state}"
    if status == 200 and state != task["state"]:
        return f"answered 200 as {state}, but the task ended {task['state']}"
    if status == 202 and state in TERMINAL_STATES:
        return f"answered 202 (under way) for a task already {state}"
    return ""


def _milliseconds(text: str) -> int:
    return math.floor(seconds(text) * 1000 + 1e-6)


# --- a paused pipeline ----------------------------------------------------------------------------------------------


def pause_windows(record: dict) -> list[tuple[str, float, float]]:
    """(pipeline, from, to): surely paused from the pause's return until the resume's call (or for good)."""
    windows, paused = [], {}
    for control in record["controls"]:
        if control.get("failed") is True:
            continue
        if control["action"] == "pause":
            paused[control["pipeline"]] = seconds(control["returned_at"])
        elif control["pipeline"] in paused:
            windows.append((control["pipeline"], paused.pop(control["pipeline"]), seconds(control["called_at"])))
    windows += [(pipeline, since, math.inf) for pipeline, since in paused.items()]
    return windows


@_invariant(
    "nothing_started_while_paused",
    "no step of a paused pipeline started while it was paused, but those its gate let through before the pause",
)
def _nothing_started_while_paused(run: RecordedRun) -> tuple[int, list[str]]:
    violations, checked = [], 0
    for pipeline, since, until in pause_windows(run.record):
        for task, attempt, steps in _started(run, pipeline):
            checked += 1
            if not since < _start(attempt) < until:
                continue
            read_by, gate = _gate_read_by(attempt, steps)
            if read_by > since:
                violations.append(
                    f"task {task['id']}: {_where(attempt)} while {pipeline} was paused, let through by {gate}"
                )
    return checked, violations


# --- limits ---------------------------------------------------------------------------------------------------------


@_invariant(
    "concurrency_within_limit",
    "at no moment more step attempts of a pipeline with max_concurrency overlapped than it allows",
)
def _concurrency_within_limit(run: RecordedRun) -> tuple[int, list[str]]:
    violations, checked = [], 0
    for pipeline, policy in sorted(run.record["meta"]["policies"].items()):
        limit = policy["max_concurrency"]
        if limit is None:
            continue
        placed = sorted(
            ((task, a) for task, a, _ in _started(run, pipeline) if a["finished_at"] is not None),
            key=lambda pair: _start(pair[1]),
        )
        checked += len(placed)
        # An attempt that ends when another starts did not overlap it: ends sort first.
        events = sorted(
            [(_start(a), 1, index) for index, (_, a) in enumerate(placed)]
            + [(_finish(a), 0, index) for index, (_, a) in enumerate(placed)]
        )
        running: set[int] = set()
        over = False
        for _, starting, index in events:
            if not starting:
                running.discard(index)
                over = over and len(running) > limit
                continue
            running.add(index)
            if len(running) > limit and not over:
                over = True  # one violation per stretch over the limit
                overlapping = ", ".join(
                    f"task {placed[i][0]['id']} {placed[i][1]['step_name']!r}" for i in sorted(running)
                )
                at = placed[index][1]["started_at"]
                violations.append(
                    f"{pipeline}: {len(running)} step attempts at once (limit {limit}) at {at}: {overlapping}"
                )
    return checked, violations


@_invariant(
    "rate_within_limit",
    "no rate window held more step starts of a rate-limited pipeline than its rate: counted on the starts "
    "whose permit is known to fall inside the window",
)
def _rate_within_limit(run: RecordedRun) -> tuple[int, list[str]]:
    # A start's permit is stamped (PostgreSQL's clock) before the step starts (its worker's clock), at its
    # gate: a boundary's permit after the step before it finished, a claim's at most CLAIM_SLACK_SECONDS
    # before the start. Each start so has an interval known to hold its permit. N + 1 starts whose
    # intervals all lie within one window (s - window, s] mean N + 1 permits in it: more than N permit
    # rows can give, since a row is taken again only a window after its last use. (Comparing the starts'
    # times alone would be wrong: a worker reads its clock some moment after its permit.)
    violations, checked = [], 0
    for pipeline, policy in sorted(run.record["meta"]["policies"].items()):
        rate = policy["rate_limit"]
        if rate is None:
            continue
        count, window = rate["count"], float(rate["window_seconds"])
        starts = sorted(
            ((_start(a), _gate_read_by(a, steps)[0], a) for _, a, steps in _started(run, pipeline)),
            key=lambda start: start[0],
        )
        checked += len(starts)
        burst_until, first = -math.inf, 0
        for index, (end, _, last) in enumerate(starts):
            while starts[first][0] <= end - window:  # a permit is no later than its start: not in this window
                first += 1
            inside = [
                (start, permit_from)
                for start, permit_from, _ in starts[first : index + 1]
                if permit_from > end - window
            ]
            if len(inside) > count and end > burst_until:
                burst_until = end + window  # one violation per burst
                since = min(permit_from for _, permit_from in inside)
                violations.append(
                    f"{pipeline}: {len(inside)} step starts up to {last['started_at']} whose permits all fell within "
                    f"{end - since:.3f} s, at most {count} per {window:g} s"
                )
    return checked, violations


# --- reporting ------------------------------------------------------------------------------------------------------


def control_summary(record: dict) -> list[tuple[str, int]]:
    """What the campaign's client and operator did, and what each cancel found the task doing."""
    answers = Counter(request["status"] for request in record["cancels"] if not request["repeat"])
    lines = [
        ("cancels answered 200 (cancelled)", answers[200]),
        ("cancels answered 202 (under way)", answers[202]),
        ("cancels answered 409 (finished)", answers[409]),
        ("cancels without an answer", sum(n for status, n in answers.items() if status == 0 or status >= 500)),
        ("cancels sent again (same cancel)", sum(1 for request in record["cancels"] if request["repeat"])),
    ]
    run = RecordedRun.of(record)
    found = Counter(_found(run, task) for task in run.tasks.values() if task["cancel_requested_at"] is not None)
    lines += [(f"cancel found the task {what}", n) for what, n in sorted(found.items())]
    interrupted = sum(1 for a in record["attempts"] if a["outcome"] == "cancelled")
    lines.append(("step attempts interrupted by a cancel", interrupted))
    holds = record["meta"].get("holds")  # recorded by the campaign for people; older records have none
    if isinstance(holds, dict):
        for pipeline, by_hold in sorted(holds.items()):
            lines += [(f"{pipeline} tasks held ({hold})", n) for hold, n in sorted(by_hold.items())]
    for control in record["controls"]:
        when = f" at {control['at']:.1f} s" if isinstance(control.get("at"), int | float) else ""
        failed = " (failed)" if control.get("failed") is True else ""
        lines.append((f"{control['action']} of {control['pipeline']}{when}{failed}", 1))
    return lines + _waits_and_schedules(record)


def _waits_and_schedules(record: dict) -> list[tuple[str, int]]:
    """The approvals' signals by their answer, and the schedule's slots, when the record has them."""
    lines = []
    sent = Counter((send["role"], send["status"], send["code"]) for send in record.get("signals_sent", []))
    for (role, status, code), n in sorted(sent.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] or "")):
        lines.append((f"signals ({role}) answered {status or 'nothing'}{f' {code}' if code else ''}", n))
    for schedule in record.get("schedules", []):
        fired = sum(1 for run in record.get("schedule_runs", []) if run["schedule"] == schedule["name"])
        lines += [
            (f"slots of {schedule['name']} fired", fired),
            (f"slots of {schedule['name']} skipped (overlap)", schedule["slots_skipped"]),
            (f"slots of {schedule['name']} missed (outage)", schedule["slots_missed"]),
        ]
    return lines


def _found(run: RecordedRun, task: dict) -> str:
    cancel_at, steps = seconds(task["cancel_requested_at"]), _steps(run, task)
    timed = [a for a in steps if a["started_at"] is not None]
    if any(_start(a) <= cancel_at and (a["finished_at"] is None or cancel_at <= _finish(a)) for a in timed):
        return "mid-step"
    before = [a for a in timed if _start(a) <= cancel_at]
    if not before and not [a for a in steps if a["started_at"] is None]:
        return "before its first step"
    if before and before[-1]["outcome"] in RETRIED_OUTCOMES:
        return "waiting for a retry"
    return "between two steps"
