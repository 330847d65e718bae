"""Every engine line about a task carries its context (issue 42, point 1), checked in the source.

A line that names a task (``"task_id"`` in its ``extra``) spreads ``task_fields(task)`` (or the attempt's
``attempt_fields()``), which give ``pipeline``, ``step`` (its name), ``step_index``, ``attempt`` and ``trace_id``:
a new line written with the id alone fails here, unless its event is one whose row was never read.
``tests/acceptance/test_log_context_live.py`` reads the same fields from real processes' JSON output.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tasks.models import Task
from tasks.observability.log_fields import task_fields

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "tasks"
SKIPPED = ("demo", "migrations")
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
FIELD_MAKERS = {"task_fields", "attempt_fields", "_fields"}

# Events whose line has the id and no row to read the rest from: the row was not found, or the line is written
# where only the id is at hand (a batch's run that raised before it read its task).
ID_ONLY_EVENTS = {"delivery_skipped", "batch_task_failed", "release_failed"}


def _log_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LOG_METHODS:
            continue
        target = node.func.value
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if name != "logger":
            continue
        extra = next((kw.value for kw in node.keywords if kw.arg == "extra"), None)
        if isinstance(extra, ast.Dict):
            yield node, extra


def _literal_keys(extra: ast.Dict) -> dict[str, ast.AST]:
    return {
        key.value: value for key, value in zip(extra.keys, extra.values, strict=True) if isinstance(key, ast.Constant)
    }


def _spreads_fields(extra: ast.Dict) -> bool:
    for key, value in zip(extra.keys, extra.values, strict=True):
        if key is None and isinstance(value, ast.Call):
            func = value.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in FIELD_MAKERS:
                return True
    return False


def engine_lines_with_the_id_alone() -> list[str]:
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        relative = path.relative_to(ENGINE)
        if relative.parts[0] in SKIPPED:
            continue
        for call, extra in _log_calls(ast.parse(path.read_text(), filename=str(path))):
            keys = _literal_keys(extra)
            if "task_id" not in keys or _spreads_fields(extra):
                continue
            event = keys.get("event")
            event_name = event.value if isinstance(event, ast.Constant) else None
            if event_name in ID_ONLY_EVENTS:
                continue
            found.append(f"tasks/{relative}:{call.lineno} ({event_name})")
    return found


def test_every_engine_line_naming_a_task_spreads_its_fields():
    assert engine_lines_with_the_id_alone() == []


def test_the_guard_finds_a_line_with_the_id_alone(tmp_path, monkeypatch):
    # The guard can fail: a module logging a task by its id alone is named.
    module = tmp_path / "tasks" / "lifecycle"
    module.mkdir(parents=True)
    (module / "late.py").write_text(
        'logger.info("late", extra={"event": "task_late", "task_id": str(task.pk)})\n'
        'logger.info("fine", extra={"event": "task_fine", **task_fields(task)})\n'
        'logger.info("gone", extra={"event": "delivery_skipped", "task_id": task_id})\n'
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ENGINE"]), "ENGINE", tmp_path / "tasks")
    assert engine_lines_with_the_id_alone() == ["tasks/lifecycle/late.py:1 (task_late)"]


def test_task_fields_names_the_step_and_its_index_and_the_attempt():
    task = Task(pipeline="p", step_names=["fetch", "send"], current_step=1, step_attempt=3)
    fields = task_fields(task)
    assert fields == {"task_id": str(task.pk), "pipeline": "p", "step": "send", "step_index": 1, "attempt": 3}
    earlier = task_fields(task, step_index=0, attempt=2)
    assert (earlier["step"], earlier["step_index"], earlier["attempt"]) == ("fetch", 0, 2)
    # Past the last step (a finished task): the index, and no name.
    assert task_fields(Task(pipeline="p", step_names=["fetch"], current_step=1))["step"] == ""
