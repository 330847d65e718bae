"""What an invariant of a recorded run returns, and how a module of invariants registers its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chaos.record import RecordedRun

# Under a failing invariant the table shows this many violations and counts the rest.
VIOLATIONS_SHOWN = 5


@dataclass(frozen=True)
class InvariantResult:
    name: str
    description: str
    checked: int
    violations: tuple[str, ...] = ()

    @property
    def holds(self) -> bool:
        return not self.violations


Invariant = Callable[[RecordedRun], InvariantResult]
Check = Callable[[RecordedRun], tuple[int, list[str]]]


def registrar(invariants: list[Invariant]) -> Callable[[str, str], Callable[[Check], Invariant]]:
    """A decorator that registers a function returning (things checked, violations) in ``invariants``, in order."""

    def invariant(name: str, description: str) -> Callable[[Check], Invariant]:
        def register(function: Check) -> Invariant:
            def judge(run: RecordedRun) -> InvariantResult:
                checked, violations = function(run)
                return InvariantResult(name, description, checked, tuple(violations))

            invariants.append(judge)
            return judge

        return register

    return invariant
