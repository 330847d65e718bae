"""The tasks a campaign submits and cancels: a plan drawn from the seed, then HTTP clients that follow it.

Most submissions carry an Idempotency-Key and are retried with the same key when the answer is lost or
is a 5xx, as a careful client would; some are sent by several clients at once with one key; some carry
no key (sent once); some have a deadline short enough to pass mid-pipeline; some belong to users the
platform refuses (402). A share goes to the campaign's limited pipeline (``chaos.pipelines``) instead of
the demo's. A share is cancelled over the API by their client (``Canceller``) at a moment of their run the
plan picks: as soon as the task is accepted, once it is seen running or waiting for a retry, after a
while, or once it finished (a 409); some of those cancels are sent a second time, which must be the same
cancel. A cancel whose answer is lost or a 5xx is sent again: cancelling is idempotent. A share of the keyed
tasks is sent in batches (``POST /api/v1/tasks/batch``, each item with its own key), so the workers run batch
deliveries (several tasks per RQ job) under the same faults; a batch whose answer is lost or a 5xx is sent
again whole, and an item refused for now (a 5xx, or its key still in use by a duplicate's request) goes again
on its own, with its key. A share goes to the campaign's approval pipeline, whose client sends the manager's
decision as a signal (``chaos.signals``).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import requests

from chaos.clients import CLIENT_TIMEOUT, thread_session
from chaos.record import ACCEPTED_STATUSES, CANCEL_ACCEPTED_STATUSES, TERMINAL_STATES
from chaos.signals import APPROVAL_PIPELINE, PlannedSignal, Signaller, planned_signal

# Shares of the plan (each drawn per task from the seed).
KEYLESS_SHARE = 0.15
DUPLICATE_SHARE = 0.10  # of keyed tasks: sent by DUPLICATE_CLIENTS clients at the same moment
DUPLICATE_CLIENTS = 3
DEADLINE_SHARE = 0.08
DEADLINE_RANGE = (0.3, 3.0)  # seconds: short enough that many pass before the last step
BROKE_SHARE = 0.05  # tasks of users the platform answers 402
# Batches: this share of the keyed tasks is batched; a batch holds the batched tasks planned within
# BATCH_WINDOW seconds of its first (sent at the first's time), BATCH_MAX_ITEMS at most.
BATCH_SHARE = 0.2
BATCH_WINDOW = 2.0
BATCH_MAX_ITEMS = 8
# The share of tasks sent to the approval pipeline (of those not sent to the limited one).
APPROVAL_SHARE = 0.12
# A keyed request whose answer is lost or a 5xx is sent again with the same key, this many times in all.
MAX_SENDS = 8
PLATFORM_PIPELINE = "report"
# Declared in chaos.pipelines, which only imports once Django is set up (the campaign's deployment does it).
LIMITED_PIPELINE = "report_limited"
# When the client cancels a task it chose to cancel (drawn per task, with these weights):
CANCEL_MODES = {
    "at_once": 0.2,  # as soon as the submission is answered: mostly queued or held, sometimes running already
    "running": 0.3,  # once the task is seen running (the limited pipeline's charge step waits: mid-step)
    "retrying": 0.2,  # once it is seen waiting for a retry (or after WATCH_SECONDS, whatever it is doing)
    "after": 0.15,  # after a random delay (CANCEL_DELAY_RANGE)
    "finished": 0.15,  # once it is terminal: the API must refuse it (409 task_not_cancellable)
}
CANCEL_DELAY_RANGE = (0.1, 3.0)
REPEAT_SHARE = 0.3  # of cancels: sent once more, this long after the first was answered
REPEAT_DELAY_RANGE = (0.0, 0.5)
# How often a cancelling client looks at its task, and for how long at most, per mode.
POLL_SECONDS = {"running": 0.05, "retrying": 0.1, "finished": 0.25}
WATCH_SECONDS = {"running": 10.0, "retrying": 10.0, "finished": 30.0}
# A submission planned to meet the pause is this far inside it: the pause's own call and the submission's
# round trip both take time, and a fault may slow either.
PAUSE_MARGIN = 1.5


@dataclass(frozen=True)
class PlannedCancel:
    mode: str  # a key of CANCEL_MODES
    delay: float  # seconds after the answer, for the mode "after"
    repeat_after: float | None  # seconds after the first cancel was answered, when it is sent again


@dataclass(frozen=True)
class PlannedTask:
    index: int
    at: float  # seconds after the start
    user_id: str
    topic: str
    idempotency_key: str | None
    clients: int
    deadline_seconds: float | None
    pipeline: str = PLATFORM_PIPELINE
    cancel: PlannedCancel | None = None
    batch: int | None = None  # the batch its first client sends it in (the index of the batch's first task)
    signal: PlannedSignal | None = None  # the approval pipeline's: when and what its client decides

    def body(self) -> dict:
        body: dict = {"pipeline": self.pipeline, "input": {"user_id": self.user_id, "topic": self.topic}}
        if self.deadline_seconds is not None:
            body["deadline_seconds"] = self.deadline_seconds
        return body


def plan(
    *,
    seed: int,
    tasks: int,
    window: float,
    with_402: bool,
    limited_share: float = 0.0,
    cancel_share: float = 0.0,
    batch_share: float = 0.0,
    approval_share: float = 0.0,
    paused: tuple[float, float] | None = None,
) -> tuple[list[PlannedTask], list[str]]:
    """The submissions, in time order, and the users the platform must refuse.

    ``limited_share`` of the tasks go to the limited pipeline, ``cancel_share`` are cancelled by their
    client, ``batch_share`` of the keyed ones are sent in batches, ``approval_share`` of the others go to the
    approval pipeline, whose client signals the decision. These come from generators of their own,
    drawn the same for every share, so a seed's submissions stay what they were without them and a share
    changes nothing but itself.

    ``paused`` (seconds after the start: when the limited pipeline's pause begins and ends) makes sure a
    cancel meets a task before its first step: workers that drain the queue as fast as it fills start most
    tasks before an answer reaches their client, so an "at once" cancel alone may find none queued. The
    first submission well inside the pause (PAUSE_MARGIN from either end) goes to the limited pipeline and
    is cancelled at once, while the pause holds it.
    """
    rng = random.Random(f"workload-{seed}")
    live = random.Random(f"live-control-{seed}")
    approvals = random.Random(f"approvals-{seed}")
    users = max(10, tasks // 5)
    broke_users = [f"broke-{n}" for n in range(max(1, users // 20))] if with_402 else []
    offsets = sorted(rng.uniform(0, window) for _ in range(tasks))
    planned = []
    for index, at in enumerate(offsets):
        if broke_users and rng.random() < BROKE_SHARE:
            user = rng.choice(broke_users)
        else:
            user = f"user-{rng.randrange(users)}"
        keyless = rng.random() < KEYLESS_SHARE
        clients = DUPLICATE_CLIENTS if not keyless and rng.random() < DUPLICATE_SHARE else 1
        deadline = round(rng.uniform(*DEADLINE_RANGE), 2) if rng.random() < DEADLINE_SHARE else None
        limited, cancel = live.random() < limited_share, _planned_cancel(live)
        approval, signal = approvals.random() < approval_share and not limited, planned_signal(approvals)
        planned.append(
            PlannedTask(
                index=index,
                at=at,
                user_id=user,
                topic=f"chaos topic {index}",
                idempotency_key=None if keyless else f"chaos-{seed}-{index}",
                clients=clients,
                deadline_seconds=deadline,
                pipeline=LIMITED_PIPELINE if limited else APPROVAL_PIPELINE if approval else PLATFORM_PIPELINE,
                cancel=cancel if live.random() < cancel_share else None,
                signal=signal if approval else None,
            )
        )
    planned = _batched(planned, random.Random(f"batches-{seed}"), batch_share)
    if paused is not None and limited_share > 0 and cancel_share > 0:
        start, end = paused[0] + PAUSE_MARGIN, paused[1] - PAUSE_MARGIN
        held = next((n for n, task in enumerate(planned) if start <= task.at <= end), None)
        if held is not None:
            at_once = PlannedCancel(mode="at_once", delay=0.0, repeat_after=None)
            planned[held] = replace(planned[held], pipeline=LIMITED_PIPELINE, cancel=at_once, batch=None, signal=None)
    return planned, broke_users


def _batched(planned: list[PlannedTask], rng: random.Random, share: float) -> list[PlannedTask]:
    """``planned`` with a ``share`` of its keyed tasks grouped into batches (a keyless one could not be resent)."""
    marked = [rng.random() < share for _ in planned]  # one draw per task, whatever the share: see plan()
    batched, first, size = [], None, 0
    for task, chosen in zip(planned, marked, strict=True):
        if not chosen or task.idempotency_key is None:
            batched.append(task)
            continue
        if first is None or task.at - first.at > BATCH_WINDOW or size >= BATCH_MAX_ITEMS:
            first, size = task, 0
        size += 1
        batched.append(replace(task, batch=first.index))
    return batched


def _planned_cancel(rng: random.Random) -> PlannedCancel:
    (mode,) = rng.choices(list(CANCEL_MODES), weights=list(CANCEL_MODES.values()))
    delay = round(rng.uniform(*CANCEL_DELAY_RANGE), 2)
    repeat_after = round(rng.uniform(*REPEAT_DELAY_RANGE), 2)
    return PlannedCancel(mode=mode, delay=delay, repeat_after=repeat_after if rng.random() < REPEAT_SHARE else None)


class Submitter:
    """Sends the plan over HTTP on time, from a pool of client threads; keeps what every client got."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        threads: int = 24,
        canceller: Canceller | None = None,
        signaller: Signaller | None = None,
    ) -> None:
        self.url = api_url + "/api/v1/tasks"
        self.token = token
        self.canceller = canceller
        self.signaller = signaller
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="client")

    def run(self, planned: list[PlannedTask], started: float, stop: threading.Event) -> None:
        futures = []
        batches: dict[int, list[PlannedTask]] = {}
        for task in planned:
            if task.batch is not None:
                batches.setdefault(task.batch, []).append(task)
        for task in planned:
            delay = started + task.at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            # A batched task's first client sends it with its batch, when the batch's first task is due.
            group = batches.pop(task.batch, None) if task.batch is not None else None
            if group is not None:
                futures.append(self._pool.submit(self._send_batch, group))
            for client in range(1 if task.batch is not None else 0, task.clients):
                futures.append(self._pool.submit(self._send, task, client))
        for future in futures:
            future.result()
        self._pool.shutdown()

    def _session(self) -> requests.Session:
        return thread_session(self._local, self.token)

    def _send_batch(self, group: list[PlannedTask]) -> None:
        """One batch of the group's tasks, for their first client; an item refused for now goes again alone."""
        items = [{**task.body(), "idempotency_key": task.idempotency_key} for task in group]
        response, status, error = _post_until(
            self._session(),
            self.url + "/batch",
            sends=MAX_SENDS,
            accepted={200},
            resend=lambda status: status >= 500,
            json={"items": items},
        )
        answers = response.json()["items"] if status == 200 else [None] * len(group)
        for task, answer in zip(group, answers, strict=True):
            if answer is None or answer["status"] >= 500 or answer["status"] == 409:
                # Lost with the batch, or refused for now (its key is in a duplicate's request still running).
                self._send(task, 0, batch=group[0].index, sends=MAX_SENDS - 1)
                continue
            accepted = answer["status"] in ACCEPTED_STATUSES
            error = "" if accepted else str(answer["error"])[:200]
            self._record(
                task,
                0,
                answer["status"],
                answer["task"]["id"] if accepted else None,
                answer["replayed"],
                error,
                batch=group[0].index,
            )

    def _send(self, task: PlannedTask, client: int, *, batch: int | None = None, sends: int = MAX_SENDS) -> None:
        headers = {"Idempotency-Key": task.idempotency_key} if task.idempotency_key else {}
        sends = sends if task.idempotency_key else 1
        task_id, replayed = None, False
        # A 409 (the first request with this key still running) and a 5xx go again, with the same key.
        response, status, error = _post_until(
            self._session(),
            self.url,
            sends=sends,
            accepted=ACCEPTED_STATUSES,
            resend=lambda status: status >= 500 or status == 409,
            json=task.body(),
            headers=headers,
        )
        if status in ACCEPTED_STATUSES:
            task_id = response.json()["id"]
            replayed = response.headers.get("Idempotent-Replayed") == "true"
        self._record(task, client, status, task_id, replayed, error, batch=batch)

    def _record(
        self, task: PlannedTask, client: int, status: int, task_id, replayed: bool, error: str, *, batch: int | None
    ) -> None:
        with self._lock:
            self.records.append(
                {
                    "request_id": f"{task.index}-{client}",
                    "idempotency_key": task.idempotency_key,
                    "body": task.body(),
                    "status": status,
                    "task_id": task_id,
                    "replayed": replayed,
                    "error": error,
                    "batch": batch,  # the batch it was first sent in (its first task's index), or None
                }
            )
        # The first client of a task cancels it (the others of a duplicate submission only submit).
        if task_id is not None and task.cancel is not None and client == 0 and self.canceller is not None:
            self.canceller.schedule(task, task_id)
        if task_id is not None and task.signal is not None and client == 0 and self.signaller is not None:
            self.signaller.schedule(task.index, task.signal, task_id)


def _post_until(
    session: requests.Session, url: str, *, sends: int, accepted, resend, **kwargs
) -> tuple[requests.Response | None, int, str]:
    """POST up to ``sends`` times until an ``accepted`` status or one ``resend`` refuses (a lost answer is status 0).

    Returns the last response (None if it was lost), its status and, unless accepted, its error (the exception's
    name or the body's first 200 characters). Each send that does not end it is followed by a back-off.
    """
    response, status, error = None, 0, ""
    for send in range(sends):
        try:
            response = session.post(url, timeout=CLIENT_TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            response, status, error = None, 0, type(exc).__name__
        else:
            status = response.status_code
            if status in accepted:
                return response, status, ""
            error = response.text[:200]
            if not resend(status):
                return response, status, error
        time.sleep(min(0.2 * 2**send, 2.0))  # back off before the same request goes again
    return response, status, error


class Canceller:
    """Cancels the planned tasks over HTTP, each at its moment, from a pool of client threads.

    Keeps every cancel request's outcome (``records``): its answer's status, the task's state in it (the
    409's ``details.state``) and the cancel's ``requested_at`` as the API reported it.
    """

    def __init__(self, api_url: str, token: str, stop: threading.Event, *, threads: int = 12) -> None:
        self.url = api_url + "/api/v1/tasks/"
        self.token = token
        self.stop = stop
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._futures: list[Future] = []
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="canceller")

    def schedule(self, task: PlannedTask, task_id: str) -> None:
        with self._lock:
            self._futures.append(self._pool.submit(self._run, task, task_id))

    def wait(self) -> None:
        """Once the submissions are all sent: until every cancel was (each waits WATCH_SECONDS at most)."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.result()
        self._pool.shutdown()

    def _run(self, task: PlannedTask, task_id: str) -> None:
        cancel = task.cancel
        assert cancel is not None
        if cancel.mode == "after":
            self.stop.wait(cancel.delay)
        elif cancel.mode in POLL_SECONDS:
            self._await_moment(task_id, cancel.mode)
        if self.stop.is_set():
            return
        self._send(task, task_id, repeat=False)
        if cancel.repeat_after is not None and not self.stop.wait(cancel.repeat_after):
            self._send(task, task_id, repeat=True)

    def _await_moment(self, task_id: str, mode: str) -> None:
        """Poll the task until it is in the state the mode waits for (or terminal, or the watch is over)."""
        wanted = {"running": {"running"}, "retrying": {"retry_scheduled"}, "finished": set()}[mode]
        deadline = time.monotonic() + WATCH_SECONDS[mode]
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                response = thread_session(self._local, self.token).get(self.url + task_id, timeout=CLIENT_TIMEOUT)
            except requests.RequestException:
                response = None
            if response is not None and response.status_code == 200:
                state = response.json()["state"]
                if state in wanted or state in TERMINAL_STATES:
                    return
            self.stop.wait(POLL_SECONDS[mode])

    def _send(self, task: PlannedTask, task_id: str, *, repeat: bool) -> None:
        assert task.cancel is not None
        sent_at = datetime.now(UTC).isoformat()
        state, requested_at = None, None
        # Cancelling again is the same cancel: safe to resend after a 5xx or a lost answer.
        response, status, error = _post_until(
            thread_session(self._local, self.token),
            self.url + task_id + "/cancel",
            sends=MAX_SENDS,
            accepted=CANCEL_ACCEPTED_STATUSES,
            resend=lambda status: status >= 500,
            json={"reason": f"chaos: {task.cancel.mode}"},
        )
        if status in CANCEL_ACCEPTED_STATUSES:
            body = response.json()
            state, requested_at = body["state"], (body["cancel"] or {}).get("requested_at")
        elif status == 409:
            state = ((response.json().get("error") or {}).get("details") or {}).get("state")
        with self._lock:
            self.records.append(
                {
                    "request_id": f"{task.index}-cancel-{2 if repeat else 1}",
                    "task_id": task_id,
                    "mode": task.cancel.mode,
                    "repeat": repeat,
                    "status": status,
                    "state": state,
                    "requested_at": requested_at,
                    "sent_at": sent_at,
                    "error": error,
                }
            )
