"""The write door: only ``tasks.lifecycle`` writes a task's rows (Task, DeadLetter, StepAttempt, Checkpoint,
SideEffect), enforced twice.

- At run time, the models' managers refuse a bulk write outside the door (``tasks.models.door``).
- Here, by reading the code of ``tasks/`` and ``dlq/``: what a manager cannot see, an instance's ``save()`` or
  ``delete()``, ``create()`` and friends, a call of one of the FSM's transitions, raw SQL that writes their tables.

The reading is by name, as a reviewer would read it: a write whose receiver is one of those models (``Task.objects
…``, ``task.attempts…``) or an instance named like one (``task``, ``item``, ``attempt``, ``checkpoint``,
``effect``…), and an ``UPDATE``/``INSERT INTO``/``DELETE FROM`` whose table is formatted from one of the models.
On the tree before the door existed it found 49 writes in 10 modules.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks.models import Task
from tasks.models.door import WriteOutsideDoor, door, door_forced

ROOT = Path(__file__).resolve().parents[2]
DOOR = "tasks/lifecycle/"
# The models themselves (their transitions call each other) and the door's guard.
NOT_SCANNED = ("tasks/models/",)
DOOR_MODELS = frozenset(
    {
        "Task",
        "DeadLetter",
        "DLQItem",
        "Checkpoint",
        "StepAttempt",
        "SideEffect",
        "Signal",
        "PipelineSchedule",
        "ScheduleRun",
    }
)
# Reverse relations to a task's rows (``related_name`` on their foreign keys to Task).
RELATED_ROWS = frozenset({"attempts", "checkpoints", "side_effects", "dlq_items", "signals", "runs"})
WRITE_METHODS = frozenset(
    {"save", "delete", "update", "create", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}
)
INSTANCE_NAME = re.compile(r"(^|_)(task|item|dead_letter|letter|attempt|checkpoint|effect|side_effect|signal)s?$")
SQL_WRITE = re.compile(r"\b(UPDATE|INSERT INTO|DELETE FROM)\s+$")


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def transition_names() -> frozenset[str]:
    """The FSM's transition methods on Task, from django-fsm-2's own introspection."""
    return frozenset(transition.name for transition in Task().get_all_state_transitions())


def writes_in(source: str, path: str, transitions: frozenset[str]) -> list[Write]:
    """Every write of a task's rows in ``source`` that the door's rules see."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, node.func.value
            root, chain = _root_and_chain(receiver)
            on_rows = _name(root) in DOOR_MODELS or bool(RELATED_ROWS & set(chain))
            instance = bool(INSTANCE_NAME.search(_name(receiver)))
            if method in WRITE_METHODS and (on_rows or (method in ("save", "delete") and instance)):
                found.append(Write(path, node.lineno, ast.unparse(node)[:100]))
            elif method in transitions and instance:
                found.append(Write(path, node.lineno, f"transition {ast.unparse(node)[:90]}"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _sql_writes(node, path)
    return found


def _sql_writes(function: ast.FunctionDef | ast.AsyncFunctionDef, path: str) -> list[Write]:
    # Names bound in the function to something formatted from a door model's table (``q(Task._meta.db_table)``).
    tables = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for name, value in pairs:
                    if isinstance(name, ast.Name) and _names(value) & DOOR_MODELS and "db_table" in _names(value):
                        tables.add(name.id)
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.JoinedStr):
            for text, formatted in zip(node.values, node.values[1:], strict=False):
                if (
                    isinstance(text, ast.Constant)
                    and isinstance(text.value, str)
                    and SQL_WRITE.search(text.value)
                    and isinstance(formatted, ast.FormattedValue)
                ):
                    names = _names(formatted.value)
                    if names & DOOR_MODELS or names & tables:
                        found.append(
                            Write(
                                path, node.lineno, f"SQL {text.value.strip()[-20:]} {{{ast.unparse(formatted.value)}}}"
                            )
                        )
    return found


def _root_and_chain(node: ast.AST) -> tuple[ast.AST, list[str]]:
    chain = []
    while True:
        if isinstance(node, ast.Call | ast.Subscript):
            node = node.func if isinstance(node, ast.Call) else node.value
        elif isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        else:
            return node, chain


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _names(node: ast.AST) -> set[str]:
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)} | {
        sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute)
    }


def modules_outside_the_door() -> list[Path]:
    paths = sorted((ROOT / "tasks").rglob("*.py")) + sorted((ROOT / "dlq").rglob("*.py"))
    return [
        path
        for path in paths
        if "migrations" not in path.parts
        and not (relative := path.relative_to(ROOT).as_posix()).startswith(DOOR)
        and not relative.startswith(NOT_SCANNED)
    ]


def test_only_the_door_writes_a_tasks_rows():
    transitions = transition_names()
    found = [
        write
        for path in modules_outside_the_door()
        for write in writes_in(path.read_text(), path.relative_to(ROOT).as_posix(), transitions)
    ]
    assert not found, "written outside tasks.lifecycle:\n" + "\n".join(map(str, found))


def test_the_door_is_where_the_writes_are():
    # The rules above find the door's own writes: the scan is not blind.
    transitions = transition_names()
    inside = [
        write
        for path in sorted((ROOT / DOOR).glob("*.py"))
        for write in writes_in(path.read_text(), path.relative_to(ROOT).as_posix(), transitions)
    ]
    kinds = {write.what.split(" ")[0] for write in inside}
    assert len(inside) >= 40 and {"transition", "SQL"} <= kinds, inside


@pytest.mark.parametrize(
    "code",
    [
        "Task.objects.filter(pk=1).update(state='failed')",
        "DeadLetter.objects.create(task=task)",
        "Checkpoint.objects.filter(task_id=1).delete()",
        "task.attempts.all().delete()",
        "task.save(update_fields=['state'])",
        "self.dead_letter.save()",
        "item.delete()",
        "task.make_due()",
        "claim.task.succeed(result=None)",
        "StepAttempt.objects.bulk_create(rows)",
        "SideEffect.objects.get_or_create(task=task)",
    ],
)
def test_the_scan_finds_each_kind_of_write(code):
    assert writes_in(f"def f(task, item, claim, rows):\n    {code}\n", "m.py", transition_names())


def test_the_scan_finds_raw_sql_that_writes_a_door_table():
    source = textwrap.dedent(
        """
        def extend(cursor):
            table = q(Task._meta.db_table)
            cursor.execute(f"UPDATE {table} SET lease_expires_at = now()")

        def other(cursor):
            slots, tasks = ConcurrencySlot._meta.db_table, Task._meta.db_table
            cursor.execute(f"UPDATE {slots} SET task_id = NULL FROM {tasks}")
            cursor.execute(f"DELETE FROM {tasks} WHERE id = 1")
        """
    )
    found = writes_in(source, "m.py", frozenset())
    assert [write.line for write in found] == [4, 9]


def test_the_scan_leaves_reads_and_other_models_alone():
    source = textwrap.dedent(
        """
        def f(task, rule):
            Task.objects.filter(pk=task.pk).exists()
            AlertRule.objects.filter(pk=1).update(version=2)
            rule.save()
            task.step_name_at(0)
            values.update({"a": 1})
        """
    )
    assert writes_in(source, "m.py", transition_names()) == []


def test_the_manager_refuses_a_stray_update_and_names_the_door():
    with pytest.raises(WriteOutsideDoor, match=r"Task\.objects…update\(\) outside tasks\.lifecycle"):
        Task.objects.filter(pk="00000000-0000-0000-0000-000000000000").update(state="failed")


BULK_WRITES = {
    "delete": lambda queryset: queryset.delete(),
    "bulk_create": lambda queryset: queryset.bulk_create([]),
    "bulk_update": lambda queryset: queryset.bulk_update([], ["pk"]),
}


@pytest.mark.parametrize("operation", sorted(BULK_WRITES))
def test_the_manager_refuses_every_bulk_write(operation):
    from tasks.models import Checkpoint, DeadLetter, SideEffect, Signal, StepAttempt

    for model in (Task, DeadLetter, Checkpoint, StepAttempt, SideEffect, Signal):
        with pytest.raises(WriteOutsideDoor, match=f"{model.__name__}.objects…{operation}"):
            BULK_WRITES[operation](model.objects.none())


def test_inside_the_door_the_manager_lets_the_write_through():
    seen = []

    @door
    def a_door_function():
        # An empty bulk_create returns before any query: the refusal would come first.
        seen.append(Task.objects.bulk_create([]))

    a_door_function()
    with door_forced():
        seen.append(Task.objects.bulk_create([]))
    assert seen == [[], []]
    with pytest.raises(WriteOutsideDoor):  # and the door closes behind it
        Task.objects.bulk_create([])
