"""RELIABILITY_PIPELINE_MODULES: a module that does not import is one ImproperlyConfigured naming it and the cause."""

from __future__ import annotations

import sys
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured

from tasks import registry


@pytest.fixture
def pipeline_module(tmp_path, monkeypatch, settings):
    """Write a module under a fresh name, list it in the setting, and forget it (and its pipelines) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registered = set(registry.names())
    written: list[str] = []

    def write(source: str) -> tuple[str, str]:
        name = f"pipelines_{uuid.uuid4().hex[:8]}"
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        settings.RELIABILITY_PIPELINE_MODULES = [name]
        written.append(name)
        return name, str(path)

    yield write
    for name in written:
        sys.modules.pop(name, None)
    for name in set(registry.names()) - registered:
        registry.unregister(name)


def load_error() -> str:
    with pytest.raises(ImproperlyConfigured) as raised:
        registry.load_pipeline_modules()
    return str(raised.value)


def test_an_error_at_import_names_the_module_and_the_line_that_raised(pipeline_module):
    module, path = pipeline_module("from tasks import Pipeline\n\nPipeline('p_ok')\nURL = base_url + '/x'\n")
    assert load_error() == (
        f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: "
        f"NameError: name 'base_url' is not defined ({path}, line 4)"
    )


def test_a_pipeline_declared_wrongly_points_at_the_declaration_not_at_the_engine(pipeline_module):
    module, path = pipeline_module("from tasks import Pipeline\n\norders = Pipeline('report')\n")
    assert load_error() == (
        f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: "
        f"ConfigurationError: a pipeline named 'report' is already registered ({path}, line 3)"
    )


def test_a_missing_dependency_of_a_module_is_named(pipeline_module):
    module, _ = pipeline_module("import acme_sdk_not_installed\n")
    assert load_error() == (
        f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: "
        "ModuleNotFoundError: No module named 'acme_sdk_not_installed'"
    )


def test_a_syntax_error_says_where(pipeline_module):
    module, _ = pipeline_module("def charge(ctx:\n    return {}\n")
    assert load_error() == (
        f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: "
        f"SyntaxError: '(' was never closed ({module}.py, line 1)"
    )
