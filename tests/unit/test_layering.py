"""Dependencies point down (ARCHITECTURE.md, "Layers"): the engine never imports the console, nothing runtime
imports the development tools. Read from the source with ``ast``, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DEVELOPMENT_ONLY = {"devtools", "chaos", "scripts", "tests"}
# package -> the top-level project packages it must never import
FORBIDDEN = {
    "tasks": {"dlq"} | DEVELOPMENT_ONLY,
    "dlq": DEVELOPMENT_ONLY,
    "reliability_console": DEVELOPMENT_ONLY,
}


def imported_modules(source: str) -> set[str]:
    """Every module a piece of Python source imports (absolute names; relative imports as ``.name``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node) and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                names.add(argument.value)
    return names


def _is_dynamic_import(call: ast.Call) -> bool:
    function = call.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return name in {"import_module", "__import__"}


def violations(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        for module in imported_modules(path.read_text()):
            top = module.split(".")[0]
            if top in forbidden:
                found.append(f"{path.relative_to(root)} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_a_layer_above_it(package):
    assert violations(package, FORBIDDEN[package]) == []


@pytest.mark.parametrize(
    "source",
    [
        "from dlq.models import DLQItem",
        "import dlq.metrics",
        "def f():\n    from dlq import bulk\n",
        "import importlib\nimportlib.import_module('dlq.alerting.rules')",
        "__import__('dlq')",
    ],
)
def test_the_check_sees_every_way_of_importing_the_console(tmp_path, source):
    engine = tmp_path / "tasks"
    engine.mkdir()
    (engine / "module.py").write_text(source)
    (engine / "fine.py").write_text("from tasks.models import Task\nimport django")
    found = violations("tasks", FORBIDDEN["tasks"], root=tmp_path)
    assert len(found) == 1 and found[0].startswith("tasks/module.py imports dlq")
