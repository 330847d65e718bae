"""The engine's public surface: ``tasks`` exports what a project that uses it imports, lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tasks
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
    assert done.stdout.strip() == "[]"


def test_the_old_services_module_names_where_its_functions_went():
    with pytest.raises(ImportError, match=r"task_submit is tasks\.task_submit .*tasks\.lifecycle\.operator"):
        import tasks.services  # noqa: F401


def test_the_old_exceptions_module_says_they_are_imported_from_tasks():
    with pytest.raises(ImportError, match=r"import the exceptions from tasks"):
        import reliability_console.exceptions  # noqa: F401


def test_a_pipeline_module_exports_only_what_it_defines():
    import tasks.pipelines

    assert all(getattr(tasks.pipelines, name).__module__ == "tasks.pipelines" for name in tasks.pipelines.__all__)


def test_an_exception_imported_from_the_pipelines_module_names_its_place():
    with pytest.raises(ImportError, match=r"from tasks import PermanentError"):
        from tasks.pipelines import PermanentError  # noqa: F401
