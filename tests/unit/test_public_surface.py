"""The engine's public surface: ``tasks`` exports what a project that uses it imports, lazily."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys

import pytest

import tasks
from tasks import moved
from tests.support import ROOT, process_env


@pytest.mark.parametrize("name", tasks.__all__)
def test_every_public_name_resolves_to_its_definition(name):
    value = getattr(tasks, name)
    # Where it is defined, never a module that imports it from elsewhere: one way to import each name.
    assert value.__name__ == name and value.__module__ == tasks._PUBLIC[name]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Pipe'"):
        tasks.Pipe  # noqa: B018


def test_importing_the_package_loads_no_model_before_the_apps_are_ready():
    probe = "import sys, tasks; print(sorted(m for m in sys.modules if m.startswith(('tasks.', 'django.db.models'))))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=process_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The lazy exports' helper and the table of moved modules, and no model.
    assert done.stdout.strip() == "['tasks.exports', 'tasks.moved']"


def test_the_old_services_module_names_where_its_functions_went():
    with pytest.raises(
        ImportError, match=r"tasks\.services was split up: tasks\.task_submit .*tasks\.lifecycle\.operator"
    ):
        import tasks.services  # noqa: F401


def test_the_old_exceptions_module_says_they_are_imported_from_tasks():
    with pytest.raises(ImportError, match=r"import the exceptions from tasks"):
        import reliability_console.exceptions  # noqa: F401


@pytest.mark.parametrize("name", ["DeadLetter", "Task"])
def test_the_consoles_models_module_does_not_pass_on_the_engines_models(name):
    with pytest.raises(ImportError, match=rf"^dlq\.models does not export {name}: from tasks\.models import {name}$"):
        exec(f"from dlq.models import {name}", {})


def test_a_pipeline_module_exports_only_what_it_defines():
    import tasks.pipelines.pipeline as declaration

    assert all(getattr(declaration, name).__module__ == "tasks.pipelines.pipeline" for name in declaration.__all__)


def test_an_exception_imported_from_the_pipelines_module_names_its_place():
    with pytest.raises(ImportError, match=r"from tasks import PermanentError"):
        from tasks.pipelines.pipeline import PermanentError  # noqa: F401


# --- the modules grouped into packages (tasks.moved) -----------------------------------------------------------


@pytest.mark.parametrize("old", sorted(set(moved.MOVED_MODULES) - {"tasks.services"}))
def test_a_moved_module_names_its_new_place_and_the_new_place_imports(old):
    new = moved.MOVED_MODULES[old]
    with pytest.raises(ModuleNotFoundError, match=rf"^{re.escape(old)} moved: it is {re.escape(new)} now$"):
        importlib.import_module(old)
    assert importlib.import_module(new).__name__ == new
    assert old not in sys.modules


def test_no_moved_path_is_a_module_of_the_tree():
    # The finder answers only once every other finder found nothing; a module back at an old path would win
    # silently and drift from its new copy.
    assert [
        old
        for old in moved.MOVED_MODULES
        if importlib.util.find_spec(old.rsplit(".", 1)[0]) and (ROOT / (old.replace(".", "/") + ".py")).exists()
    ] == []


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (
            "from tasks.submission import task_submit",
            "tasks.submission is a package now: from tasks import task_submit",
        ),
        (
            "from tasks.delivery import deliver_now",
            "tasks.delivery is a package now: from tasks.delivery.enqueue import deliver_now",
        ),
        (
            "from tasks.outbound import outbound_url_check",
            "tasks.outbound is a package now: from tasks.outbound.policy import outbound_url_check",
        ),
        ("from tasks.pipelines import Pipeline", "tasks.pipelines is a package now: from tasks import Pipeline"),
    ],
)
def test_a_name_of_a_module_that_became_a_package_names_where_it_went(statement, message):
    with pytest.raises(ImportError, match=f"^{re.escape(message)}$"):
        exec(statement, {})


def test_a_package_that_was_a_module_still_imports_its_submodules_and_refuses_other_names():
    namespace: dict = {}
    exec("from tasks.delivery import sweeper, worker", namespace)
    assert namespace["sweeper"].__name__ == "tasks.delivery.sweeper"
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
        exec("from tasks.delivery import no_such_name", {})


def test_the_selectors_surface_resolves_every_read_to_its_module():
    import tasks.selectors

    for name, module in tasks.selectors._READS.items():
        assert getattr(tasks.selectors, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_read'"):
        tasks.selectors.no_such_read  # noqa: B018
