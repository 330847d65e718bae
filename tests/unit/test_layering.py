"""Dependencies point down (ARCHITECTURE.md, "Layers"): the engine never imports the console, nothing runtime
imports the development tools. Read from the source with ``ast``, so an import inside a function counts too."""

from __future__ import annotations

import ast
import importlib
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

# The engine's surface for the console (dlq/) and the composition root (reliability_console/): exactly these modules,
# each with why. A package here is its ``__init__`` only, never its submodules: reads come from ``tasks.selectors``,
# acts from ``tasks.lifecycle``, rows from ``tasks.models``, each a surface that names what it exports. Everything
# else of the engine is its own business.
CONSOLE_MAY_IMPORT = {
    # the three doors
    "tasks.selectors": "the reads: tasks, pipelines and what holds them, waiting tasks, schedules, RQ queues",
    "tasks.lifecycle": "the acts: every write of an engine row (operator actions, cancels, controls, clients, purges)",
    "tasks.models": "the models",
    # the public surface and the extension points
    "tasks": "the public surface (tasks/__init__.py): Pipeline, RetryPolicy, task_submit, the exceptions, ...",
    "tasks.exceptions": "the exceptions, the door's refusals among them (PipelineControlRefused, ScheduleRefused)",
    "tasks.registry": "what the engine runs: pipelines, RQ entry points, sweeper chores",
    # policies the console shares with the engine rather than copy
    "tasks.conf": "the settings, which the console's own are declared like",
    "tasks.setting_rules": "the rules a setting's value is checked by",
    "tasks.redaction": "the one redactor of everything stored or shown",
    "tasks.outbound.policy": "the one policy for every URL the product calls (callbacks, alert channels)",
    "tasks.outbound.signing": "the one signature on every request the product signs",
    "tasks.pipelines.limits": "the limits' values and their parsing (a value module)",
    "tasks.observability.metrics": "recording a metric once its change commits, never failing the caller",
    "tasks.management.options": "the commands' option parsing: one readable line for any bad value",
    "tasks.api.errors": "the API's JSON error body, which bad_input answers /api/ requests with",
    "tasks.database_errors": "what a database error says, whichever driver: bad_input's refused filters",
}
CONSOLE_PACKAGES = ("dlq", "reliability_console")


def console_engine_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """Engine module -> where the console imports it (path:line), from every import of dlq/ and
    reliability_console/, wherever it stands."""
    from tests.unit.test_import_cycles import import_graph

    found: dict[str, list[str]] = {}
    for module, imports in import_graph(root, ("tasks", *CONSOLE_PACKAGES)).items():
        if module.split(".")[0] not in CONSOLE_PACKAGES:
            continue
        for imported, where in imports.items():
            if imported.split(".")[0] == "tasks":
                found.setdefault(imported, []).append(where)
    return found


def test_the_console_imports_only_the_engines_surface():
    private = {module: where for module, where in console_engine_imports().items() if module not in CONSOLE_MAY_IMPORT}
    assert private == {}, "the console imports engine internals; reach them through the surface"


def test_every_allowance_exists_and_the_console_uses_each():
    from tests.unit.test_import_cycles import module_paths

    modules = module_paths(ROOT, ("tasks",))
    assert sorted(set(CONSOLE_MAY_IMPORT) - set(modules)) == []
    assert sorted(set(CONSOLE_MAY_IMPORT) - set(console_engine_imports())) == [], "an allowance nothing uses: drop it"


@pytest.mark.parametrize(
    "source",
    [
        "from tasks.delivery.enqueue import get_queue",
        "from tasks.delivery import enqueue",
        "def f():\n    from tasks.execution.gates import gate_of\n",
        "import tasks.delivery.sweeper",
        "import importlib\nimportlib.import_module('tasks.execution.runner')",
        "from tasks.lifecycle.outcomes import task_failed",
        "from tasks.selectors.queues import queue_states",
    ],
)
def test_the_console_check_sees_every_way_of_importing_an_engine_internal(tmp_path, source):
    for name, text in {
        "tasks/__init__.py": "",
        "tasks/delivery/__init__.py": "",
        "tasks/delivery/enqueue.py": "",
        "tasks/delivery/sweeper.py": "",
        "tasks/execution/__init__.py": "",
        "tasks/execution/gates.py": "",
        "tasks/execution/runner.py": "",
        "tasks/selectors/__init__.py": "",
        "tasks/selectors/queues.py": "",
        "tasks/lifecycle/__init__.py": "",
        "tasks/lifecycle/outcomes.py": "",
        "dlq/__init__.py": "",
        "dlq/fine.py": "from tasks import Pipeline\nfrom tasks.selectors import x\nfrom tasks.lifecycle import act\n",
        "dlq/module.py": source,
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {
        module: where for module, where in console_engine_imports(tmp_path).items() if module not in CONSOLE_MAY_IMPORT
    }
    assert len(found) == 1
    assert [where.split(":")[0] for where in next(iter(found.values()))] == ["dlq/module.py"]


def _exported(package: str) -> dict[str, str]:
    module = importlib.import_module(package)
    return module._ACTS if package == "tasks.lifecycle" else module._READS


@pytest.mark.parametrize("package", ["tasks.lifecycle", "tasks.selectors"])
def test_each_name_of_a_surface_is_defined_where_it_says(package):
    surface = importlib.import_module(package)
    for name, module in _exported(package).items():
        value = getattr(surface, name)
        assert value is getattr(importlib.import_module(module), name)
        assert module.startswith(package + "."), f"{name}: a surface exports only its own package's names"


def test_every_name_the_console_takes_from_a_surface_is_exported_by_it():
    # ``from tasks.lifecycle import X`` fails at import for a name the surface lacks; this names every such X.
    names = {"tasks.lifecycle": set(), "tasks.selectors": set()}
    for path in [*sorted((ROOT / "dlq").rglob("*.py")), *sorted((ROOT / "reliability_console").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in names:
                names[node.module].update(alias.name for alias in node.names)
    for package, imported in names.items():
        assert sorted(imported - set(_exported(package))) == []
