"""The tasks a campaign submits: a plan drawn from the seed, then HTTP clients that follow it.

Most submissions carry an Idempotency-Key and are retried with the same key when the answer is lost or
is a 5xx, as a careful client would; some are sent by several clients at once with one key; some carry
no key (sent once); some have a deadline short enough to pass mid-pipeline; some belong to users the
platform refuses (402).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

# Shares of the plan (each drawn per task from the seed).
KEYLESS_SHARE = 0.15
DUPLICATE_SHARE = 0.10  # of keyed tasks: sent by DUPLICATE_CLIENTS clients at the same moment
DUPLICATE_CLIENTS = 3
DEADLINE_SHARE = 0.08
DEADLINE_RANGE = (0.3, 3.0)  # seconds: short enough that many pass before the last step
BROKE_SHARE = 0.05  # tasks of users the platform answers 402
# A keyed request whose answer is lost or a 5xx is sent again with the same key, this many times in all.
MAX_SENDS = 8
CLIENT_TIMEOUT = 30.0


@dataclass(frozen=True)
class PlannedTask:
    index: int
    at: float  # seconds after the start
    user_id: str
    topic: str
    idempotency_key: str | None
    clients: int
    deadline_seconds: float | None

    def body(self) -> dict:
        body: dict = {"pipeline": "report", "input": {"user_id": self.user_id, "topic": self.topic}}
        if self.deadline_seconds is not None:
            body["deadline_seconds"] = self.deadline_seconds
        return body


def plan(*, seed: int, tasks: int, window: float, with_402: bool) -> tuple[list[PlannedTask], list[str]]:
    """The submissions, in time order, and the users the platform must refuse."""
    rng = random.Random(f"workload-{seed}")
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
        planned.append(
            PlannedTask(
                index=index,
                at=at,
                user_id=user,
                topic=f"chaos topic {index}",
                idempotency_key=None if keyless else f"chaos-{seed}-{index}",
                clients=clients,
                deadline_seconds=deadline,
            )
        )
    return planned, broke_users


class Submitter:
    """Sends the plan over HTTP on time, from a pool of client threads; keeps what every client got."""

    def __init__(self, api_url: str, token: str, *, threads: int = 24) -> None:
        self.url = api_url + "/api/v1/tasks"
        self.token = token
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="client")

    def run(self, planned: list[PlannedTask], started: float, stop: threading.Event) -> None:
        futures = []
        for task in planned:
            delay = started + task.at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            for client in range(task.clients):
                futures.append(self._pool.submit(self._send, task, client))
        for future in futures:
            future.result()
        self._pool.shutdown()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {self.token}"
            self._local.session = session
        return session

    def _send(self, task: PlannedTask, client: int) -> None:
        headers = {"Idempotency-Key": task.idempotency_key} if task.idempotency_key else {}
        sends = MAX_SENDS if task.idempotency_key else 1
        status, task_id, replayed, error = 0, None, False, ""
        for send in range(sends):
            try:
                response = self._session().post(self.url, json=task.body(), headers=headers, timeout=CLIENT_TIMEOUT)
            except requests.RequestException as exc:
                status, error = 0, type(exc).__name__
            else:
                status, error = response.status_code, ""
                if status in (200, 201):
                    task_id = response.json()["id"]
                    replayed = response.headers.get("Idempotent-Replayed") == "true"
                    break
                if status < 500 and status != 409:
                    error = response.text[:200]
                    break
                error = response.text[:200]
            time.sleep(min(0.2 * 2**send, 2.0))  # back off before the same request goes again
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
                }
            )
