"""Pipelines are found like admin modules: each installed app's ``pipelines.py``, in every process that sets Django up.

Each case starts a fresh interpreter (``django.setup()``, as web, workers and the sweeper do) because the registry
of this test process already holds every pipeline its settings loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

from tasks import registry
from tests.support import ROOT

DEMO = "report"
BENCH = {"bench_noop_1", "bench_noop_10", "bench_bulk", "bench_critical"}
# Enough for Django to start on a loaded machine.
SETUP_TIMEOUT_SECONDS = 60


def registered_pipelines(settings_module: str, **environ: str) -> set[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELIABILITY_")}
    env.update(DJANGO_SETTINGS_MODULE=settings_module, DJANGO_DEBUG="1", **environ)
    script = "import django, json; django.setup(); from tasks import registry; print(json.dumps(registry.names()))"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.processes
def test_an_installed_apps_pipelines_module_is_found_and_nothing_of_the_standalone_project_is():
    names = registered_pipelines("tests.apps.settings", RELIABILITY_ENABLE_BENCH_PIPELINES="1")

    assert "shop_orders" in names
    # The engine's and the console's own pipelines are registered wherever they are installed.
    assert {"task_callback", "alert_notify"} <= names
    assert DEMO not in names
    assert not names & BENCH


@pytest.mark.processes
def test_the_standalone_project_registers_the_demo_and_on_request_the_bench_pipelines():
    assert DEMO in registered_pipelines("reliability_console.settings")
    assert not registered_pipelines("reliability_console.settings") & BENCH
    with_bench = registered_pipelines("reliability_console.settings", RELIABILITY_ENABLE_BENCH_PIPELINES="1")
    assert BENCH <= with_bench
    assert DEMO in with_bench


@pytest.mark.processes
def test_an_app_listed_in_the_setting_too_is_imported_once():
    names = registered_pipelines("tests.apps.settings", RELIABILITY_PIPELINE_MODULES="tests.apps.shop.pipelines")

    assert "shop_orders" in names


@pytest.fixture
def app_package(tmp_path, monkeypatch):
    """A fresh package under a unique name, as an installed app; forgotten (with its pipelines) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registered = set(registry.names())
    name = f"app_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")

    def write(pipelines_source: str | None) -> tuple[AppConfig, str]:
        path = tmp_path / name / "pipelines.py"
        if pipelines_source is not None:
            path.write_text(pipelines_source)
        return AppConfig.create(name), str(path)

    yield write
    for module in [module for module in sys.modules if module == name or module.startswith(f"{name}.")]:
        del sys.modules[module]
    for pipeline in set(registry.names()) - registered:
        registry.unregister(pipeline)


def discovery_error(app_config: AppConfig) -> str:
    with pytest.raises(ImproperlyConfigured) as raised:
        registry.app_pipelines_discover([app_config])
    return str(raised.value)


def test_an_app_without_a_pipelines_module_is_skipped(app_package):
    app_config, _ = app_package(None)

    registry.app_pipelines_discover([app_config])


def test_an_apps_pipelines_module_that_raises_names_the_module_and_the_line(app_package):
    app_config, path = app_package("from tasks import Pipeline\n\nPipeline('p_ok')\nURL = base_url + '/x'\n")

    assert discovery_error(app_config) == (
        f"INSTALLED_APPS: cannot import '{app_config.name}.pipelines': "
        f"NameError: name 'base_url' is not defined ({path}, line 4)"
    )


def test_a_missing_dependency_inside_an_apps_pipelines_module_is_its_failure_not_an_absent_module(app_package):
    app_config, _ = app_package("import acme_sdk_not_installed\n")

    assert discovery_error(app_config) == (
        f"INSTALLED_APPS: cannot import '{app_config.name}.pipelines': "
        "ModuleNotFoundError: No module named 'acme_sdk_not_installed'"
    )
