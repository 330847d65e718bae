"""The faults a campaign injects into the deployment, on a schedule drawn from the seed.

The platform's own faults (5xx, 429 with Retry-After, slow answers past the step timeout, 402 for some
users) are settings of the simulator; the rest happen to processes and services at scheduled moments:
SIGKILL of a worker (the pool starts a replacement), SIGSTOP of a worker for longer than the lease then
SIGCONT (a zombie), a Redis restart, a Redis FLUSHALL, and pg_terminate_backend of every other session
on the campaign's database. Two more act on parts only some topologies have: under Sentinel, the Redis
primary SIGKILLed and a replica promoted (``redis-failover``); on a PostgreSQL cluster the campaign started
itself, a fast restart of the server (``pg-restart``). Under Sentinel the Redis faults act on the current
primary; behind PgBouncer the PostgreSQL faults act on the server behind it.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from dataclasses import dataclass

from chaos.deployment import Deployment
from chaos.processes import worker_pid

logger = logging.getLogger(__name__)

PLATFORM_FAULTS = ("5xx", "429", "slow", "402")
PROCESS_FAULTS = ("sigkill", "sigstop", "redis-restart", "redis-flush", "pg-terminate")
# Each needs a part of the topology that only the campaign's options start: the option's name.
TOPOLOGY_FAULTS = {"redis-failover": "--sentinel", "pg-restart": "--own-cluster"}
ALL_FAULTS = PLATFORM_FAULTS + PROCESS_FAULTS + tuple(TOPOLOGY_FAULTS)

FAIL_RATE = 0.06
THROTTLE_RATE = 0.04
RETRY_AFTER_SECONDS = 1
# Past every step timeout of the report pipeline (the longest is 15 s).
SLOW_SECONDS = 16
# One SIGKILL per this many seconds of the fault window, at least MIN_KILLS.
SECONDS_PER_KILL = 12
MIN_KILLS = 3
# How long the zombie stays stopped beyond its lease.
ZOMBIE_EXTRA_SECONDS = 3.0
# pg-terminate right after a PostgreSQL restart may first meet sessions the restart ended, and PgBouncer
# refuses logins for a second after one failed (server_login_retry): try a few times, this far apart.
PG_TERMINATE_TRIES = 5
PG_TERMINATE_RETRY_SECONDS = 0.5
# How long PostgreSQL stays down in a restart: a few seconds, longer than a pooler's or a client's first retry.
PG_DOWN_SECONDS = 3.0
# Sentinel calls the primary down after 1.5 s, then elects and promotes: seconds, not this many.
FAILOVER_TIMEOUT = 60.0


def applicable_faults(*, sentinel: bool, own_cluster: bool) -> tuple[str, ...]:
    """Every fault the topology has the parts for: what ``--faults all`` means."""
    present = {"--sentinel": sentinel, "--own-cluster": own_cluster}
    return tuple(kind for kind in ALL_FAULTS if present.get(TOPOLOGY_FAULTS.get(kind, ""), True))


def simulator_args(*, faults: frozenset[str], seed: int, slow_rate: float, broke_users: list[str]) -> tuple:
    args = ["--seed", str(seed), "--initial-balance", "1000000", "--retry-after", str(RETRY_AFTER_SECONDS)]
    if "5xx" in faults:
        args += ["--fail-rate", str(FAIL_RATE)]
    if "429" in faults:
        args += ["--throttle-rate", str(THROTTLE_RATE)]
    if "slow" in faults:
        args += ["--slow-rate", f"{slow_rate:.5f}", "--slow-seconds", str(SLOW_SECONDS)]
    if "402" in faults and broke_users:
        args += ["--insufficient-users", ",".join(broke_users)]
    return tuple(args)


@dataclass(frozen=True)
class ScheduledFault:
    at: float  # seconds after the start
    kind: str


def schedule(*, seed: int, faults: frozenset[str], window: float) -> list[ScheduledFault]:
    """Process faults at moments inside [10 %, 80 %] of the window, in time order."""
    rng = random.Random(f"faults-{seed}")
    planned: list[ScheduledFault] = []
    if "sigkill" in faults:
        kills = max(MIN_KILLS, round(window * 0.7 / SECONDS_PER_KILL))
        planned += [ScheduledFault(rng.uniform(0.1, 0.8) * window, "sigkill") for _ in range(kills)]
    once = {"sigstop": (0.15, 0.35), "redis-restart": (0.3, 0.45), "pg-terminate": (0.45, 0.6)}
    once["redis-flush"] = (0.6, 0.75)
    # Drawn after the others, so adding them leaves every earlier schedule of a seed as it was.
    once["redis-failover"] = (0.2, 0.3)
    once["pg-restart"] = (0.5, 0.65)
    for kind, (low, high) in once.items():
        if kind in faults:
            planned.append(ScheduledFault(rng.uniform(low, high) * window, kind))
    return sorted(planned, key=lambda fault: fault.at)


class FaultInjector:
    """Carries out a schedule against a deployment and keeps a log of what it did."""

    def __init__(self, deployment: Deployment, *, seed: int, lease_seconds: float) -> None:
        self.deployment = deployment
        self.lease_seconds = lease_seconds
        self.rng = random.Random(f"victims-{seed}")
        self.log: list[dict] = []
        self._started = 0.0
        self._zombies: list[threading.Thread] = []

    def run(self, planned: list[ScheduledFault], started: float, stop: threading.Event) -> None:
        self._started = started
        for fault in planned:
            delay = started + fault.at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            try:
                getattr(self, "_" + fault.kind.replace("-", "_"))()
            except Exception as exc:  # one failed injection is reported, the campaign goes on
                self._note(fault.kind, f"injection failed: {type(exc).__name__}: {exc}", failed=True)
        for zombie in self._zombies:
            zombie.join()

    def _note(self, kind: str, detail: str, *, failed: bool = False) -> None:
        entry = {"kind": kind, "at": round(time.monotonic() - self._started, 2), "detail": detail}
        if failed:
            entry["failed"] = True
        self.log.append(entry)
        logger.info("fault %s at %.1fs: %s", kind, entry["at"], detail)

    def _victim(self):
        """Prefer a worker that holds a lease right now (it is mid-step), else any live worker."""
        from django.db import DatabaseError, close_old_connections

        from tasks.models import LEASED_STATES, Task

        close_old_connections()
        try:
            owners = list(
                Task.objects.filter(state__in=LEASED_STATES)
                .exclude(lease_owner="")
                .values_list("lease_owner", flat=True)
            )
        except DatabaseError:  # PostgreSQL is restarting (another fault): any live worker will do
            owners = []
        busy = [w for w in (self.deployment.pool.by_pid(worker_pid(o)) for o in owners) if w is not None]
        candidates = busy or self.deployment.pool.live()
        if not candidates:
            return None, False
        candidates.sort(key=lambda w: w.pid)
        return self.rng.choice(candidates), bool(busy)

    def _sigkill(self) -> None:
        worker, busy = self._victim()
        if worker is None:
            self._note("sigkill", "no live worker", failed=True)
            return
        worker.signal(signal.SIGKILL)
        self._note("sigkill", f"{worker.name} (pid {worker.pid}, {'mid-step' if busy else 'idle'})")

    def _sigstop(self) -> None:
        worker, busy = self._victim()
        if worker is None:
            self._note("sigstop", "no live worker", failed=True)
            return
        pause = self.lease_seconds + ZOMBIE_EXTRA_SECONDS
        worker.signal(signal.SIGSTOP)
        self._note("sigstop", f"{worker.name} (pid {worker.pid}, {'mid-step' if busy else 'idle'}) for {pause:.1f} s")

        def wake() -> None:
            time.sleep(pause)  # the fault itself: stay stopped past the lease
            worker.signal(signal.SIGCONT)
            self._note("sigcont", f"{worker.name} (pid {worker.pid}) continued")

        thread = threading.Thread(target=wake, name="zombie-wake", daemon=True)
        thread.start()
        self._zombies.append(thread)

    def _redis_restart(self) -> None:
        redis = self.deployment.redis.describe()
        self.deployment.redis.restart()
        self._note("redis-restart", f"{redis} stopped and started again")

    def _redis_flush(self) -> None:
        self.deployment.redis.flushall()
        self._note("redis-flush", "FLUSHALL")

    def _pg_terminate(self) -> None:
        from django.db import DatabaseError, close_old_connections, connection

        for tries_left in reversed(range(PG_TERMINATE_TRIES)):
            close_old_connections()
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    (count,) = cursor.fetchone()
                break
            except DatabaseError:
                if not tries_left:
                    raise
                connection.close()
                time.sleep(PG_TERMINATE_RETRY_SECONDS)  # the server or the pooler is still coming back
        self._note("pg-terminate", f"pg_terminate_backend on {count} sessions (workers, sweeper, web)")

    def _redis_failover(self) -> None:
        began = time.monotonic()
        old, new = self.deployment.redis.failover(timeout=FAILOVER_TIMEOUT)
        self._note(
            "redis-failover",
            f"primary on port {old} SIGKILLed; Sentinel promoted the replica on port {new}; "
            f"port {old} back as its replica, {time.monotonic() - began:.1f} s in all",
        )

    def _pg_restart(self) -> None:
        cluster = self.deployment.cluster
        began = time.monotonic()
        cluster.restart("fast", down_seconds=PG_DOWN_SECONDS)
        self._note(
            "pg-restart",
            f"PostgreSQL (own cluster, port {cluster.port}) restarted fast: every session dropped, "
            f"{time.monotonic() - began:.1f} s without a server",
        )
