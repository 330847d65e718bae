"""Every setting of the engine and the console has a default in its app's conf, read lazily (issue 20)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from dlq.conf import CONSOLE_SETTINGS, console_settings
from tasks.conf import ENGINE_SETTINGS, engine_settings

ROOT = Path(__file__).resolve().parent.parent.parent
ALL_SETTINGS = {**ENGINE_SETTINGS, **CONSOLE_SETTINGS}


def test_every_default_is_the_standalone_projects_default(settings):
    for setting in ALL_SETTINGS.values():
        if setting.name == "RQ_QUEUES":
            continue
        delattr(settings, setting.name) if hasattr(settings, setting.name) else None
    for conf, table in ((engine_settings, ENGINE_SETTINGS), (console_settings, CONSOLE_SETTINGS)):
        for key, setting in table.items():
            if setting.name != "RQ_QUEUES":
                assert getattr(conf, key) == setting.default, setting.name
    assert engine_settings.LEASE_SECONDS == 30 and engine_settings.PIPELINE_MODULES == []
    assert engine_settings.QUEUES == ("critical", "default", "bulk") and engine_settings.QUEUE == "default"
    assert console_settings.CONSOLE_URL == "http://127.0.0.1:8000" and console_settings.BULK_CANARY_SIZE == 10


def test_the_standalone_settings_set_each_to_its_default(tmp_path):
    """Behaviour is unchanged: with an empty environment, the standalone project's value is the app's default."""
    names = [setting.name for setting in ALL_SETTINGS.values()]
    script = (
        "import json, reliability_console.settings as s; "
        f"print(json.dumps({{n: getattr(s, n) for n in {names!r}}}, default=str))"
    )
    environment = {"PATH": os.environ["PATH"], "DJANGO_DEBUG": "1", "RELIABILITY_VAR_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    standalone = json.loads(result.stdout)
    # The standalone project's own choices: its demo pipeline, its Redis, DATABASE_POOLER parsed to "none".
    differ = {"RELIABILITY_PIPELINE_MODULES", "RQ_QUEUES"}
    for setting in ALL_SETTINGS.values():
        if setting.name not in differ:
            expected = list(setting.default) if isinstance(setting.default, tuple) else setting.default
            assert standalone[setting.name] == expected, setting.name


def test_a_read_follows_override_settings():
    with override_settings(RELIABILITY_LEASE_SECONDS=7, RELIABILITY_BULK_CANARY_SIZE=3):
        assert engine_settings.LEASE_SECONDS == 7 and console_settings.BULK_CANARY_SIZE == 3
    assert engine_settings.LEASE_SECONDS != 7


def test_the_settings_fixture_and_a_missing_name_falls_back(settings):
    settings.RELIABILITY_QUEUE = "bulk"
    assert engine_settings.QUEUE == "bulk"
    del settings.RELIABILITY_QUEUE
    assert engine_settings.QUEUE == "default"


def test_a_default_list_is_a_copy(settings):
    del settings.RELIABILITY_PIPELINE_MODULES
    engine_settings.PIPELINE_MODULES.append("x")
    assert engine_settings.PIPELINE_MODULES == []


def test_a_required_setting_names_itself_and_an_unknown_one_is_an_attribute_error(settings):
    del settings.RQ_QUEUES
    with pytest.raises(ImproperlyConfigured, match=r"^RQ_QUEUES is not set: django-rq's queues"):
        _ = engine_settings.RQ_QUEUES
    with pytest.raises(AttributeError, match="no such setting: LEASE"):
        _ = engine_settings.LEASE


def test_every_setting_is_documented():
    """A one-line meaning in its conf, and a place in docs/configuration.md (the reference): a row of its table,
    or its paragraph on the Django settings that are no environment variables."""
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for setting in ALL_SETTINGS.values():
        assert setting.doc and "\n" not in setting.doc, setting.name
        assert f"`{setting.name}`" in configuration, f"{setting.name} is not in docs/configuration.md"


def test_no_app_module_reads_these_settings_from_django_directly():
    read = re.compile(r"\bsettings\.(RELIABILITY_\w+|PROMETHEUS_\w+|RQ_QUEUES|REPORT_PLATFORM_URL|DATABASE_POOLER)")
    found = []
    for package in ("tasks", "dlq"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "conf.py":
                continue
            for match in read.finditer(path.read_text()):
                found.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
            if 'getattr(settings, "RELIABILITY_' in path.read_text():
                found.append(f"{path.relative_to(ROOT)}: getattr(settings, RELIABILITY_…)")
    assert found == []
