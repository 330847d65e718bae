"""Where a drain's time went, by process: CPU time and run-queue wait, read from the kernel's own counters.

Linux keeps, for every thread, the time it ran on a CPU and the time it spent runnable but waiting for one
(``/proc/<pid>/task/<tid>/schedstat``: run ns, wait ns, time slices). Read once when a drain starts and once
when it ends, for the workers, the PostgreSQL backends of the bench database, the PgBouncer and the Redis
server, they say what one step costs each process and how long each waited for a CPU: on two cores, a pooler's
hop shows up as waits rather than as work (``make bench``'s PgBouncer rows). Two readings per drain and nothing
in between, so the measurement costs the drain nothing.

Only processes of this machine can be read: a remote server, or a system without ``/proc``, gives no figures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# The processes' kinds, in the order they are printed.
KINDS = ("worker", "postgres", "pgbouncer", "redis")


def _thread_times(pid: int) -> tuple[int, int] | None:
    """(run ns, run-queue wait ns) of all threads of ``pid`` so far; None once it is gone."""
    run = wait = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stats:
                ran, waited, _slices = stats.read().split()
            run += int(ran)
            wait += int(waited)
    except (OSError, ValueError):
        return None
    return run, wait


def local_process(pid: int | None, command: str) -> int | None:
    """``pid`` if it is a process of this machine whose command name starts with ``command``, else None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/comm") as comm:
            name = comm.read().strip()
    except OSError:
        return None
    return pid if name.startswith(command) else None


@dataclass
class ProcessClock:
    """Run and wait time, by kind of process, summed over the drains between each ``start`` and ``stop``.

    ``pids()`` names the processes of each kind but the workers (a drain's own, passed to ``start`` and
    ``stop``), asked at both readings: a process there at the end only (a backend that connected during the
    drain) counts from zero, since it was born during the drain.
    """

    pids: Callable[[], dict[str, Iterable[int]]]
    run_ns: dict[str, int] = field(default_factory=dict)
    wait_ns: dict[str, int] = field(default_factory=dict)
    units: int = 0
    _before: dict[int, tuple[str, int, int]] = field(default_factory=dict)

    def _read(self, workers: Iterable[int]) -> dict[int, tuple[str, int, int]]:
        readings = {}
        for kind, pids in {**self.pids(), "worker": workers}.items():
            for pid in pids:
                times = _thread_times(pid)
                if times is not None:
                    readings[pid] = (kind, *times)
        return readings

    def start(self, workers: Iterable[int]) -> None:
        self._before = self._read(workers)

    def stop(self, workers: Iterable[int], units: int) -> None:
        """End a drain that did ``units`` of work (tasks): its times are added to the sums."""
        for pid, (kind, run, wait) in self._read(workers).items():
            _, run_before, wait_before = self._before.get(pid, (kind, 0, 0))
            self.run_ns[kind] = self.run_ns.get(kind, 0) + run - run_before
            self.wait_ns[kind] = self.wait_ns.get(kind, 0) + wait - wait_before
        self.units += units

    def per_unit(self, parts: int = 1) -> dict[str, dict[str, float]]:
        """``{kind: {"cpu_us": ..., "wait_us": ...}}`` per unit of work, or per ``parts``-th of one (a task's
        steps), for the kinds that were seen."""
        if not self.units:
            return {}
        count = self.units * parts
        return {
            kind: {
                "cpu_us": round(self.run_ns[kind] / count / 1000, 1),
                "wait_us": round(self.wait_ns[kind] / count / 1000, 1),
            }
            for kind in KINDS
            if kind in self.run_ns
        }
