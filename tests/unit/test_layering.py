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


# --- what of the engine the console may import --------------------------------------------------------------------

# The engine's public modules, each with why it is public. A module with submodules listed in PUBLIC_PACKAGES
# allows them all; any other entry allows that module alone. Everything else of the engine is its own business:
# the console reaches it through these.
CONSOLE_MAY_IMPORT = {
    "tasks": "the public surface (tasks/__init__.py): Pipeline, RetryPolicy, FailurePolicy, task_submit, ...",
    "tasks.lifecycle": "the write door: every write of an engine row (tasks, controls, API clients, purges)",
    "tasks.selectors": "the reads: tasks, pipelines and what holds them, RQ queues and workers",
    "tasks.models": "the models",
    "tasks.exceptions": "the exceptions",
    "tasks.registry": "what the engine runs: pipelines, RQ entry points, sweeper chores",
    "tasks.conf": "the settings, which the console's own are declared like",
    "tasks.setting_rules": "the rules a setting's value is checked by",
    "tasks.redaction": "the one redactor of everything stored or shown",
    "tasks.outbound": "the one policy for every URL the product calls (callbacks, alert channels)",
    "tasks.signing": "the one signature on every request the product signs",
    "tasks.limits_policy": "the limits' values and their parsing (a value module)",
    "tasks.metrics": "recording a metric once its change commits, never failing the caller",
    "tasks.management.options": "the commands' option parsing: one readable line for any bad value",
}
PUBLIC_PACKAGES = {"tasks.lifecycle", "tasks.models"}


def _public(module: str) -> str | None:
    """The entry of CONSOLE_MAY_IMPORT that allows importing ``module``, or None."""
    if module in CONSOLE_MAY_IMPORT:
        return module
    return next((package for package in PUBLIC_PACKAGES if module.startswith(package + ".")), None)


def console_engine_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """Engine module -> where the console imports it (path:line), from every import of dlq/, wherever it stands."""
    from tests.unit.test_import_cycles import import_graph

    found: dict[str, list[str]] = {}
    for module, imports in import_graph(root, ("tasks", "dlq")).items():
        if module.split(".")[0] != "dlq":
            continue
        for imported, where in imports.items():
            if imported.split(".")[0] == "tasks":
                found.setdefault(imported, []).append(where)
    return found


def test_the_console_imports_only_the_engines_public_modules():
    private = {module: where for module, where in console_engine_imports().items() if _public(module) is None}
    assert private == {}, "the console imports engine internals; reach them through a public module"


def test_every_public_module_exists_and_the_console_uses_each_allowance():
    from tests.unit.test_import_cycles import module_paths

    modules = module_paths(ROOT, ("tasks",))
    assert sorted(set(CONSOLE_MAY_IMPORT) - set(modules)) == []
    used = {_public(module) for module in console_engine_imports()}
    assert sorted(set(CONSOLE_MAY_IMPORT) - used) == [], "an allowance nothing uses: drop it"


@pytest.mark.parametrize(
    "source",
    [
        "from tasks.delivery import get_queue",
        "from tasks import delivery",
        "def f():\n    from tasks.limits import held_counts\n",
        "import tasks.sweeper",
        "import importlib\nimportlib.import_module('tasks.runner')",
    ],
)
def test_the_console_check_sees_every_way_of_importing_an_engine_internal(tmp_path, source):
    for name, text in {
        "tasks/__init__.py": "",
        "tasks/delivery.py": "",
        "tasks/limits.py": "",
        "tasks/sweeper.py": "",
        "tasks/runner.py": "",
        "tasks/selectors.py": "",
        "tasks/lifecycle/__init__.py": "",
        "tasks/lifecycle/outcomes.py": "",
        "dlq/__init__.py": "",
        "dlq/fine.py": "from tasks import Pipeline\nfrom tasks.selectors import x\nfrom tasks.lifecycle import door",
        "dlq/module.py": source,
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {module: where for module, where in console_engine_imports(tmp_path).items() if _public(module) is None}
    assert len(found) == 1
    assert [where.split(":")[0] for where in next(iter(found.values()))] == ["dlq/module.py"]
