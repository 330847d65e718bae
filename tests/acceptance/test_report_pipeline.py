"""The report pipeline end to end: real workers, real Redis, PostgreSQL and the simulator over HTTP."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from rq import Worker

from dlq.models import DLQItem
from tasks.delivery.enqueue import get_queue, job_id, redis_client
from tasks.delivery.queues import queue_names
from tasks.models import AttemptKind, AttemptOutcome, DLQStatus, StepAttempt, Task
from tasks.submission.submit import task_submit
from tests.support import pid_of_owner, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}
EFFECT_KINDS = ("charge", "report", "file_put", "notification")


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def wait_terminal(task: Task, timeout: float = 60, pool=None) -> Task:
    def done():
        current = reload(task)
        return current if current.state in TERMINAL else None

    try:
        return wait_for(done, timeout=timeout, message=f"task {task.pk} to finish")
    except AssertionError:
        if pool is not None:
            print(pool.logs())
        raise


def effects(platform, task) -> Counter:
    """How many calls of each kind changed state at the platform for this task."""
    return Counter(c["kind"] for c in platform.calls(task_id=str(task.pk)) if c["effect"])


def test_a_report_succeeds_with_exactly_one_of_each_effect(platform, start_workers):
    pool = start_workers(2)
    task = task_submit(pipeline="report", input={"user_id": "alice", "topic": "sales"})
    task = wait_terminal(task, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})
    keys = [c["idempotency_key"] for c in platform.calls(task_id=str(task.pk))]
    assert len(keys) == 4 and len(set(keys)) == 4
    assert all(c["task_id"] == str(task.pk) for c in platform.calls(task_id=str(task.pk)))
    assert task.result["notification_id"]


def test_transient_faults_are_retried_with_backoff_and_one_key_per_effect(platform, start_workers):
    platform.set_faults(
        rules=[
            {"path_prefix": "/v1/quota/charges", "user_id": "bob", "status": 503, "times": 2},
            {"path_prefix": "/v1/reports", "user_id": "bob", "status": 429, "retry_after": 2, "times": 1},
            {"path_prefix": "/v1/notifications", "user_id": "bob", "slow": 11, "times": 1},
        ]
    )
    pool = start_workers(2)
    task = task_submit(pipeline="report", input={"user_id": "bob", "topic": "churn"})
    task = wait_terminal(task, timeout=90, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})

    calls = platform.calls(task_id=str(task.pk))
    by_kind: dict[str, set] = {}
    for call in calls:
        by_kind.setdefault(call["kind"], set()).add(call["idempotency_key"])
    assert all(len(keys) == 1 for keys in by_kind.values()), by_kind  # the same key on every attempt
    assert Counter(c["kind"] for c in calls)["charge"] == 3

    attempts = list(StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP).order_by("started_at"))
    failed = [a for a in attempts if a.outcome != AttemptOutcome.SUCCEEDED]
    assert [a.step_name for a in failed] == ["charge_quota", "charge_quota", "generate_report", "notify_user"]
    policy_cap = 8.0
    for attempt in failed:
        following = next(a for a in attempts if a.started_at > attempt.started_at and a.step_name == attempt.step_name)
        gap = (following.started_at - attempt.finished_at).total_seconds()
        assert gap >= attempt.retry_delay_seconds - 0.05  # no attempt starts before its backoff ends
        if attempt.retry_after_seconds:
            assert attempt.retry_delay_seconds >= attempt.retry_after_seconds == 2
        else:
            assert 0 <= attempt.retry_delay_seconds <= policy_cap
    assert failed[-1].outcome == AttemptOutcome.TIMEOUT


def test_a_permanent_402_is_not_retried_and_is_compensated_with_one_notice(platform, start_workers):
    platform.set_faults(insufficient_users=["broke"])
    pool = start_workers(2)
    task = task_submit(pipeline="report", input={"user_id": "broke", "topic": "q3"})
    task = wait_terminal(task, pool=pool)
    assert task.state == "compensated", pool.logs()
    assert (task.failure_reason, task.failure_code) == ("permanent_error", "insufficient_quota")
    assert StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP).count() == 1
    calls = platform.calls(task_id=str(task.pk))
    assert Counter(c["kind"] for c in calls) == Counter({"charge": 1, "notification": 1})
    notice = next(c for c in calls if c["kind"] == "notification")
    assert "insufficient_quota" in notice["body"]["message"]
    item = DLQItem.objects.get(task=task)
    assert (item.status, item.reason_code, item.error_code) == (
        DLQStatus.COMPENSATED,
        "permanent_error",
        "insufficient_quota",
    )
    assert item.reason


def test_a_late_permanent_error_compensates_in_reverse_order(platform, start_workers):
    platform.set_faults(rules=[{"path_prefix": "/v1/notifications", "user_id": "carol", "status": 422, "times": 1}])
    pool = start_workers(1)
    task = task_submit(pipeline="report", input={"user_id": "carol", "topic": "ops"})
    task = wait_terminal(task, pool=pool)
    assert task.state == "compensated", pool.logs()
    mutating = [c["kind"] for c in platform.calls(task_id=str(task.pk)) if c["effect"]]
    assert mutating == ["charge", "report", "file_put", "file_delete", "refund", "notification"]
    state = platform.state()
    charge = next(c for c in state["charges"].values() if c["task_id"] == str(task.pk))
    assert charge["refunded"] and not any(f["task_id"] == str(task.pk) for f in state["files"].values())


def test_a_worker_killed_mid_step_3_resumes_elsewhere_without_repeating_steps(platform, start_workers, start_sweeper):
    task = task_submit(pipeline="report", input={"user_id": "dave", "topic": "kill"})
    # The upload's body carries no user id: match the hang on the task id, set before any worker runs.
    platform.set_faults(rules=[{"path_prefix": "/v1/files/", "task_id": str(task.pk), "hang": 30, "times": 1}])
    pool = start_workers(2)
    start_sweeper()

    def in_step_3():
        current = reload(task)
        # Calls are recorded when answered; the hang rule is used up as the upload arrives.
        hung = not platform.faults()["rules"]
        return current if current.current_step == 2 and current.lease_owner and hung else None

    running = wait_for(in_step_3, timeout=30, message="step 3 in flight")
    victim = pool.by_pid(pid_of_owner(running.lease_owner))
    assert victim is not None
    victim.kill(signal.SIGKILL)

    task = wait_terminal(task, timeout=60, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert task.crash_count == 1
    kinds = Counter(c["kind"] for c in platform.calls(task_id=str(task.pk)))
    assert kinds["charge"] == 1 and kinds["report"] == 1  # steps 1 and 2 were not called again
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})
    resumed = StepAttempt.objects.get(task=task, step_name="upload_file", outcome=AttemptOutcome.SUCCEEDED)
    assert pid_of_owner(resumed.worker) != victim.pid
    assert StepAttempt.objects.filter(task=task, outcome=AttemptOutcome.CRASHED, step_name="upload_file").count() == 1


def test_a_task_delivered_twice_at_once_runs_its_steps_once(platform, start_workers):
    from tasks.delivery.enqueue import deliver_now

    platform.set_faults(rules=[{"path_prefix": "/v1/quota/charges", "user_id": "erin", "slow": 0.5, "times": 1}])
    task = task_submit(pipeline="report", input={"user_id": "erin", "topic": "dup"})
    # A second job for the same task, under another job id: two deliveries race.
    deliver_now(task.pk, 99, pipeline=task.pipeline)
    pool = start_workers(2)
    task = wait_terminal(task, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})
    assert StepAttempt.objects.filter(task=task).count() == 4
    assert "event=delivery_skipped" in pool.logs()


def test_a_deadline_passing_during_backoff_fails_without_another_attempt(platform, start_workers):
    platform.set_faults(
        rules=[{"path_prefix": "/v1/reports", "user_id": "fred", "status": 429, "retry_after": 1.5, "times": 10}]
    )
    pool = start_workers(2)
    # The 4 s deadline starts at submission: workers still starting on a busy machine would eat it.
    wait_for(lambda: len(Worker.all(connection=redis_client())) >= 2, timeout=60, message="workers to register")
    task = task_submit(pipeline="report", input={"user_id": "fred", "topic": "late"}, deadline=4)
    task = wait_terminal(task, timeout=60, pool=pool)
    assert task.state == "compensated", pool.logs()
    assert task.failure_reason == "deadline_exceeded"
    deadline_ms = task.deadline.timestamp() * 1000
    step_calls = [c for c in platform.calls(task_id=str(task.pk)) if c["kind"] in ("charge", "report")]
    assert all(c["received_ms"] <= c["deadline_ms"] <= deadline_ms + 1 for c in step_calls)
    assert not any(c["late"] for c in platform.calls(task_id=str(task.pk)))
    attempts = StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP)
    assert all(a.started_at.timestamp() * 1000 < deadline_ms for a in attempts)
    state = platform.state()
    charge = next(c for c in state["charges"].values() if c["task_id"] == str(task.pk))
    assert charge["refunded"]
    assert DLQItem.objects.get(task=task).reason_code == "deadline_exceeded"


def test_a_step_blocked_in_a_socket_read_is_interrupted_and_retried(start_workers):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections into the backlog, never answers
    try:
        pool = start_workers(1)
        task = task_submit(pipeline="t_blocker", input={"blackhole": ["127.0.0.1", listener.getsockname()[1]]})
        task = wait_terminal(task, timeout=30, pool=pool)
    finally:
        listener.close()
    assert task.state == "succeeded", pool.logs()
    first, second = StepAttempt.objects.filter(task=task).order_by("started_at")
    assert first.outcome == AttemptOutcome.TIMEOUT and first.error_code == "step_timeout"
    assert 0.9 <= first.duration_seconds <= 1.0 + 0.5
    assert second.outcome == AttemptOutcome.SUCCEEDED


def test_a_hung_http_call_is_cut_at_the_step_timeout_and_retried(platform, start_workers):
    platform.set_faults(rules=[{"path_prefix": "/v1/reports", "hang": 20, "times": 1}])
    pool = start_workers(1)
    task = task_submit(pipeline="t_http_blocker", input={})
    task = wait_terminal(task, timeout=30, pool=pool)
    assert task.state == "succeeded", pool.logs()
    first = StepAttempt.objects.filter(task=task).order_by("started_at").first()
    assert first.outcome == AttemptOutcome.TIMEOUT and first.duration_seconds <= 1.5


def test_submission_survives_redis_being_down_and_the_sweeper_delivers(
    platform, start_workers, start_sweeper, redis_server
):
    redis_server.stop()
    try:
        started = time.monotonic()
        task = task_submit(pipeline="report", input={"user_id": "gina", "topic": "outage"})
        assert time.monotonic() - started < 15
        assert reload(task).state == "queued"
    finally:
        redis_server.start()
    pool = start_workers(2)
    start_sweeper()
    task = wait_terminal(task, timeout=60, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})


def test_flushall_while_tasks_are_queued_loses_nothing(platform, start_workers, start_sweeper, redis_server):
    tasks = [task_submit(pipeline="report", input={"user_id": f"h{i}", "topic": "flush"}) for i in range(5)]
    redis_server.flushall()
    pool = start_workers(2)
    start_sweeper()
    for task in tasks:
        done = wait_terminal(task, timeout=60, pool=pool)
        assert done.state == "succeeded", pool.logs()
        assert effects(platform, done) == Counter({kind: 1 for kind in EFFECT_KINDS})


def test_a_job_popped_by_a_worker_that_died_before_starting_it_still_runs(platform, start_workers, start_sweeper):
    # A worker of several queues dequeues with BLPOP (no intermediate list); killed before it marks the job
    # started, or cut off from a primary that died just then, it leaves a job that says "queued" and is in no
    # queue. This test process is that worker: it pops the job and does nothing more.
    task = task_submit(pipeline="report", input={"user_id": "ida", "topic": "popped"})
    queues = [get_queue(name) for name in queue_names()]
    connection = redis_client()
    _, popped = connection.blpop([queue.key for queue in queues], timeout=5)
    assert popped.decode() == job_id(task.pk, 0)
    assert connection.hget(queues[0].job_class.key_for(popped.decode()), "status") == b"queued"
    pool = start_workers(2)
    start_sweeper()
    done = wait_terminal(task, timeout=60, pool=pool)
    assert done.state == "succeeded", pool.logs()
    assert effects(platform, done) == Counter({kind: 1 for kind in EFFECT_KINDS})


def test_a_task_that_kills_its_worker_every_time_ends_as_crash_loop(start_workers, start_sweeper):
    pool = start_workers(2, replace_dead=True)
    start_sweeper()
    task = task_submit(pipeline="t_crasher", input={})
    task = wait_terminal(task, timeout=90, pool=pool)
    assert task.state == "compensated", pool.logs()
    assert (task.failure_reason, task.crash_count) == ("crash_loop", 3)
    item = DLQItem.objects.get(task=task)
    assert item.reason_code == "crash_loop" and item.failing_step == "die"
    assert StepAttempt.objects.filter(task=task, outcome=AttemptOutcome.CRASHED).count() == 3


def test_a_compensation_that_keeps_failing_ends_in_compensation_failed(platform, start_workers):
    from tasks.lifecycle.operator import task_compensate

    platform.set_faults(
        rules=[
            {"path_prefix": "/v1/notifications", "user_id": "ivan", "status": 422, "times": 1},
            {"path_prefix": "/v1/quota/charges/", "method": "POST", "status": 503, "times": 1000},
        ]
    )
    pool = start_workers(1)
    task = task_submit(pipeline="report", input={"user_id": "ivan", "topic": "stuck"})
    task = wait_terminal(task, timeout=90, pool=pool)
    assert task.state == "compensation_failed", pool.logs()
    item = DLQItem.objects.get(task=task)
    assert item.status == DLQStatus.OPEN and "charge_quota" in item.compensation_error
    deletes = [c for c in platform.calls(task_id=str(task.pk)) if c["kind"] == "file_delete"]
    assert len(deletes) == 1

    platform.set_faults(rules=[])
    task_compensate(task_id=task.pk)
    task = wait_terminal(task, timeout=60, pool=pool)
    assert task.state == "compensated", pool.logs()
    # The delete that already succeeded was not repeated; the refund went through once.
    calls = platform.calls(task_id=str(task.pk))
    assert len([c for c in calls if c["kind"] == "file_delete"]) == 1
    assert len([c for c in calls if c["kind"] == "refund" and c["effect"]]) == 1
    assert DLQItem.objects.filter(task=task).count() == 1


def test_a_stopped_worker_that_wakes_after_losing_its_lease_writes_nothing(platform, start_workers, start_sweeper):
    platform.set_faults(rules=[{"path_prefix": "/v1/reports", "user_id": "zed", "slow": 1.5, "times": 1}])
    pool = start_workers(2)
    start_sweeper()
    task = task_submit(pipeline="report", input={"user_id": "zed", "topic": "zombie"})

    def in_step_2():
        current = reload(task)
        waiting = not platform.faults()["rules"]  # the slow report call has arrived
        return current if current.current_step == 1 and current.lease_owner and waiting else None

    running = wait_for(in_step_2, timeout=30, message="step 2 in flight")
    zombie = pool.by_pid(pid_of_owner(running.lease_owner))
    zombie.kill(signal.SIGSTOP)
    try:
        task = wait_terminal(task, timeout=60, pool=pool)
    finally:
        zombie.kill(signal.SIGCONT)
    assert task.state == "succeeded", pool.logs()
    wait_for(lambda: "event=lease_lost" in zombie.output(), timeout=30, message="the zombie to notice")
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})
    # The zombie's late answer did not add a checkpoint, attempt or state change.
    assert reload(task).state == "succeeded"
    assert StepAttempt.objects.filter(task=task, outcome=AttemptOutcome.SUCCEEDED).count() == 4
    assert not StepAttempt.objects.filter(task=task, worker=running.lease_owner, step_name="generate_report").filter(
        outcome=AttemptOutcome.SUCCEEDED
    )


def test_workers_refuse_jobs_that_are_not_registered_entry_points(start_workers, clean_redis):
    import django_rq
    from rq.job import JobStatus

    queue = django_rq.get_queue("default")
    job = queue.enqueue_call("os.getcwd", job_id="not-an-entry-point", failure_ttl=600)
    start_workers(1)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FAILED, timeout=30, message="job refused")
    assert "not a registered entry point" in (job.latest_result().exc_string or "")


def test_a_job_an_earlier_release_enqueued_under_the_old_entry_point_path_runs(start_workers, clean_redis):
    # A job can outlive a deploy in Redis: before tasks/delivery/ the entry point was tasks.jobs.run_task.
    from tasks.delivery.enqueue import _job_options

    task = task_submit(pipeline="t_long", input={"seconds": 0})
    queue = get_queue()
    queue.empty()  # the job this release enqueued on commit, replaced by the earlier release's
    job = queue.enqueue_call("tasks.jobs.run_task", args=(str(task.pk),), **_job_options(task.pk, task.fencing_token))
    assert queue.connection.hget(job.key, "data") and "tasks.jobs.run_task" in str(queue.fetch_job(job.id).data)
    pool = start_workers(1)
    task = wait_terminal(task, timeout=30, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert "job_refused" not in pool.logs()


def test_a_step_longer_than_the_lease_keeps_its_lease_by_heartbeat(start_workers, start_sweeper):
    pool = start_workers(1)
    start_sweeper()
    task = task_submit(pipeline="t_long", input={"seconds": 7})  # the lease is 3 s in these tests
    task = wait_terminal(task, timeout=30, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert task.crash_count == 0
    assert StepAttempt.objects.filter(task=task).count() == 1


def test_a_worker_whose_database_connection_is_killed_mid_step_recovers(platform, start_workers, start_sweeper):
    from django.db import connection

    platform.set_faults(rules=[{"path_prefix": "/v1/reports", "user_id": "pat", "slow": 1.5, "times": 1}])
    pool = start_workers(1)
    start_sweeper()
    task = task_submit(pipeline="report", input={"user_id": "pat", "topic": "db blip"})
    wait_for(lambda: not platform.faults()["rules"], timeout=30, message="step 2 in flight")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    task = wait_terminal(task, timeout=60, pool=pool)
    assert task.state == "succeeded", pool.logs()
    assert effects(platform, task) == Counter({kind: 1 for kind in EFFECT_KINDS})
