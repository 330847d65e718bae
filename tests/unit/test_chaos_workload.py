"""The campaign's plan of live control: which tasks go to the limited pipeline, which are cancelled when, the pause."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from chaos import controls, signals, workload
from chaos.signals import APPROVAL_PIPELINE
from chaos.workload import LIMITED_PIPELINE, PLATFORM_PIPELINE, plan


def planned(**shares):
    return plan(seed=4, tasks=2000, window=450, with_402=True, **shares)[0]


def test_live_control_changes_nothing_else_of_a_seeds_plan():
    without = planned()
    with_live_control = planned(limited_share=0.2, cancel_share=0.1)

    assert {task.pipeline for task in without} == {PLATFORM_PIPELINE}
    assert all(task.cancel is None for task in without)
    assert [replace(task, pipeline=PLATFORM_PIPELINE, cancel=None) for task in with_live_control] == without


def test_the_shares_are_kept_and_each_leaves_the_other_as_it_was():
    tasks = planned(limited_share=0.2, cancel_share=0.1)
    limited = [task.index for task in tasks if task.pipeline == LIMITED_PIPELINE]
    cancelled = [task for task in tasks if task.cancel is not None]

    assert 0.17 < len(limited) / len(tasks) < 0.23
    assert 0.08 < len(cancelled) / len(tasks) < 0.12
    assert {task.cancel.mode for task in cancelled} == set(workload.CANCEL_MODES)
    assert 0.2 < sum(task.cancel.repeat_after is not None for task in cancelled) / len(cancelled) < 0.4
    assert all(task.body()["pipeline"] == task.pipeline for task in tasks)
    more_cancels = planned(limited_share=0.2, cancel_share=0.3)
    assert [task.index for task in more_cancels if task.pipeline == LIMITED_PIPELINE] == limited
    assert {task.index for task in cancelled} < {task.index for task in more_cancels if task.cancel is not None}


@pytest.mark.parametrize("duration", [10, 20, 75, 600, 3600])
def test_the_pause_lasts_a_share_of_the_run_and_ends_before_the_faults_do(duration):
    seconds = controls.default_pause_seconds(duration)
    pause = controls.pause_plan(seed=7, duration=duration, pipeline=LIMITED_PIPELINE, seconds=seconds)

    assert 0 < pause.seconds <= controls.PAUSE_BOUNDS[1] and pause.seconds <= controls.MAX_PAUSE_SHARE * duration
    assert pause.seconds >= min(controls.PAUSE_BOUNDS[0], controls.MAX_PAUSE_SHARE * duration)
    assert 0 < pause.at and pause.at + pause.seconds <= controls.PAUSE_END_BY * duration
    assert controls.pause_plan(seed=7, duration=duration, pipeline=LIMITED_PIPELINE, seconds=0) is None


def test_the_limited_pipeline_is_the_report_pipeline_under_limits():
    from tasks import registry
    from tasks.demo.report_pipeline import report

    try:
        module = importlib.import_module("chaos.pipelines")
        limited, approved = module.report_limited, module.report_approved
        assert registry.get(LIMITED_PIPELINE) is limited and registry.get(APPROVAL_PIPELINE) is approved
    finally:
        # The campaign's deployment loads them; the test processes do not.
        registry.unregister(LIMITED_PIPELINE)
        registry.unregister(APPROVAL_PIPELINE)
    assert (limited.max_concurrency, str(limited.rate_limit)) == (2, "10/s")
    assert [(s.name, s.compensate, s.effects, s.timeout) for s in limited.steps] == [
        (s.name, s.compensate, s.effects, s.timeout) for s in report.steps
    ]
    assert limited.on_failure is report.on_failure and limited.validate_input is report.validate_input
    assert limited.steps[0].function is not report.steps[0].function  # the charge that waits
    # The approval pipeline: the report's steps and settings, a wait for the decision and a sleep after the charge.
    assert [step.name for step in approved.steps] == [
        "charge_quota",
        signals.APPROVAL_SIGNAL,
        signals.SLEEP_STEP,
        "generate_report",
        "upload_file",
        "notify_user",
    ]
    wait, sleep = approved.steps[1].wait, approved.steps[2].sleep
    assert (wait.timeout, wait.approval, sleep.seconds) == (signals.APPROVAL_TIMEOUT, True, signals.SLEEP_SECONDS)
    assert approved.steps[0] is report.steps[0] and approved.steps[4:] == report.steps[2:]
    assert approved.on_failure is report.on_failure and approved.retry == report.retry


def test_a_submission_inside_the_pause_is_limited_and_cancelled_at_once():
    paused = (100.0, 110.0)
    tasks = planned(limited_share=0.2, cancel_share=0.1, paused=paused)
    inside = [
        task for task in tasks if paused[0] + workload.PAUSE_MARGIN <= task.at <= paused[1] - workload.PAUSE_MARGIN
    ]
    assert inside[0].pipeline == LIMITED_PIPELINE and inside[0].cancel.mode == "at_once"
    # Nothing else of the plan changes; without a cancel share (or a pause) nothing changes at all.
    unpaused = planned(limited_share=0.2, cancel_share=0.1)
    assert [task for task in tasks if task.index != inside[0].index] == [
        task for task in unpaused if task.index != inside[0].index
    ]
    assert planned(limited_share=0.2, paused=paused) == planned(limited_share=0.2)


def test_a_share_of_keyed_tasks_is_batched_within_the_window_and_nothing_else_changes():
    tasks = planned(limited_share=0.2, cancel_share=0.1, batch_share=0.2)
    batched = [task for task in tasks if task.batch is not None]
    assert 0.12 < len(batched) / len(tasks) < 0.2  # of the keyed tasks (85 %)
    assert all(task.idempotency_key is not None for task in batched)
    by_batch = {}
    for task in batched:
        by_batch.setdefault(task.batch, []).append(task)
    first = {task.index: task for task in tasks}
    for batch, members in by_batch.items():
        assert len(members) <= workload.BATCH_MAX_ITEMS and members[0].index == batch
        assert all(0 <= task.at - first[batch].at <= workload.BATCH_WINDOW for task in members)
    assert max(len(members) for members in by_batch.values()) > 2
    assert [replace(task, batch=None) for task in tasks] == planned(limited_share=0.2, cancel_share=0.1)


def test_an_approval_share_goes_to_the_approval_pipeline_with_a_decision_and_nothing_else_changes():
    without = planned(limited_share=0.2, cancel_share=0.1)
    tasks = planned(limited_share=0.2, cancel_share=0.1, approval_share=0.12)
    approvals = [task for task in tasks if task.pipeline == APPROVAL_PIPELINE]

    as_without = [replace(task, pipeline=PLATFORM_PIPELINE, signal=None) if task.signal else task for task in tasks]
    assert as_without == without
    assert all(task.signal is not None for task in approvals)
    assert all(task.signal is None for task in tasks if task.pipeline != APPROVAL_PIPELINE)
    # Of the tasks not sent to the limited pipeline (about 80 %).
    assert 0.08 < len(approvals) / len(tasks) < 0.115
    assert {task.signal.mode for task in approvals} == set(signals.SIGNAL_MODES)
    assert 0.12 < sum(not task.signal.approved for task in approvals) / len(approvals) < 0.28
    assert any(task.signal.repeat for task in approvals) and any(task.signal.conflict for task in approvals)
    assert all(task.body()["pipeline"] == APPROVAL_PIPELINE for task in approvals)


def test_a_decision_says_who_decided_and_its_opposite_is_the_other_decision():
    signal = signals.PlannedSignal(mode="at_once", delay=0.0, approved=True, repeat=False, conflict=True)

    assert signal.payload() == {"approved": True, "by": "chaos-manager", "reason": "approved"}
    assert signal.payload(approved=False) == {"approved": False, "by": "chaos-manager", "reason": "rejected"}
