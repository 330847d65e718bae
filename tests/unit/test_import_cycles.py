"""No import circle in the engine or the console (ARCHITECTURE.md, "Layers"). Read from the source with ``ast``:
every import counts wherever it stands (top level, inside a function, under ``if TYPE_CHECKING:``), because a circle
closed by a function-level import is still a circle, only one that breaks later and further from its cause."""

from __future__ import annotations

import ast
import itertools
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("tasks", "dlq")


def module_paths(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the packages (a package is its ``__init__``)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """(absolute dotted name, line) for each name an import in the file may load: ``from pkg import name`` gives
    ``pkg.name`` (a submodule if there is one), ``import_module("x")`` with a literal gives ``x``."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            found.extend((base if alias.name == "*" else f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node) and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                found.append((argument.value, node.lineno))
    return found


def _is_dynamic_import(call: ast.Call) -> bool:
    function = call.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return name in {"import_module", "__import__"}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, str]]:
    """module -> {module it imports: where its first import of it is, as path:line}, within the packages."""
    modules = module_paths(root, packages)
    graph: dict[str, dict[str, str]] = {module: {} for module in modules}
    for module, path in modules.items():
        for name, line in imported_names(module, path):
            # `from pkg import name` names a submodule or an attribute of pkg; `import a.b.c` loads a.b.c.
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].setdefault(name, f"{path.relative_to(root)}:{line}")
    return graph


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted, in order of their first module."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                lowlink[module] = min(lowlink[module], lowlink[imported])
            elif imported in on_stack:
                lowlink[module] = min(lowlink[module], index[imported])
        if lowlink[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


def circle_path(graph: dict[str, dict[str, str]], component: list[str]) -> list[str]:
    """A closed walk a -> b -> ... -> a along real imports that passes every module of the component."""
    members = set(component)
    path = [component[0]]
    unvisited = members - {component[0]}
    while unvisited:
        path.extend(_shortest_path(graph, members, path[-1], unvisited)[1:])
        unvisited -= set(path)
    return path + _shortest_path(graph, members, path[-1], {component[0]})[1:]


def _shortest_path(graph: dict[str, dict[str, str]], members: set[str], start: str, goals: set[str]) -> list[str]:
    """The shortest path of at least one import from start to one of the goals, inside the component."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imported in sorted(graph[module]):
            if imported in goals:
                path = [imported, module]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if imported in members and imported not in came_from and imported != start:
                came_from[imported] = module
                queue.append(imported)
    raise AssertionError(f"none of {sorted(goals)} is reachable from {start}: not a strongly connected component")


def described(graph: dict[str, dict[str, str]], component: list[str]) -> str:
    path = circle_path(graph, component)
    lines = [" -> ".join(path)]
    for importer, imported in itertools.pairwise(path):
        lines.append(f"    {graph[importer][imported]} imports {imported}")
    return "\n".join(lines)


def test_no_import_circle_in_the_engine_or_the_console():
    graph = import_graph()
    components = strongly_connected(graph)
    circles = [described(graph, component) for component in components]
    assert not circles, "import circles:\n" + "\n".join(circles)


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_a_circle_closed_inside_a_function_is_found(tmp_path):
    _tree(
        tmp_path,
        {
            "tasks/__init__.py": "",
            "tasks/first.py": "from tasks.second import helper\n",
            "tasks/second.py": "def helper():\n    from tasks import first\n",
            "tasks/third.py": "from tasks.first import helper\n",
        },
    )
    graph = import_graph(tmp_path, ("tasks",))
    assert strongly_connected(graph) == [["tasks.first", "tasks.second"]]
    assert described(graph, ["tasks.first", "tasks.second"]).splitlines()[0] == (
        "tasks.first -> tasks.second -> tasks.first"
    )


@pytest.mark.parametrize(
    "source",
    [
        "if TYPE_CHECKING:\n    from tasks.first import Thing\n",
        "from .first import Thing\n",
        "import tasks.first\n",
        "import importlib\nimportlib.import_module('tasks.first')\n",
    ],
)
def test_every_way_of_importing_counts(tmp_path, source):
    _tree(tmp_path, {"tasks/__init__.py": "", "tasks/first.py": "import tasks.second\n", "tasks/second.py": source})
    assert strongly_connected(import_graph(tmp_path, ("tasks",))) == [["tasks.first", "tasks.second"]]


def test_importing_a_submodule_from_its_package_is_no_circle(tmp_path):
    _tree(
        tmp_path,
        {
            # the package re-exports its submodules' names; a submodule imports a sibling through the package
            "dlq/__init__.py": "from dlq.audit import record\nfrom dlq.actions import act\n",
            "dlq/audit.py": "def record():\n    pass\n",
            "dlq/actions.py": "from dlq import audit\nfrom . import audit as again\n",
        },
    )
    assert strongly_connected(import_graph(tmp_path, ("dlq",))) == []


def test_a_name_taken_from_a_package_imports_the_package(tmp_path):
    _tree(
        tmp_path,
        {
            "tasks/models/__init__.py": "from tasks.models.task import Task\n",
            "tasks/models/task.py": "from tasks.texts import LABELS\n",
            "tasks/texts.py": "from tasks.models import Task\n",
        },
    )
    graph = import_graph(tmp_path, ("tasks",))
    assert strongly_connected(graph) == [["tasks.models", "tasks.models.task", "tasks.texts"]]
    assert described(graph, ["tasks.models", "tasks.models.task", "tasks.texts"]).splitlines()[0] == (
        "tasks.models -> tasks.models.task -> tasks.texts -> tasks.models"
    )
