"""Traces' settings and what tracing off costs: no OpenTelemetry module imported, one check of the setting; the
system checks that name a missing SDK (tasks.W002) and a bad RELIABILITY_TRACE_URL (dlq.E001)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from reliability_console.config import validate_trace_url
from tasks import setting_rules
from tasks.observability import tracing

ROOT = Path(__file__).resolve().parent.parent.parent

# Imports the modules with tracing hooks (runner, attempts, ctx.http, submission, API, console), optionally with
# OpenTelemetry made impossible to import (an environment without the SDK), and says what it found. "redis-only"
# imports redis-py alone: since redis-py 7 it imports the OpenTelemetry SDK's metrics by itself when installed.
PROBE = r"""
import importlib.abc, json, sys
if sys.argv[1] == "redis-only":
    import redis
    print(json.dumps({"otel_modules": sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")}))
    sys.exit(0)
if sys.argv[1] == "no-sdk":
    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, NoOpenTelemetry())
import django
django.setup()
import dlq.admin, tasks.api.views, tasks.execution.attempts, tasks.outbound.http, tasks.execution.runner
import tasks.execution.waits, tasks.submission.submit
from django.core.checks import run_checks
from tasks.observability import tracing
print(json.dumps({
    "active": tracing.active is not None,
    "engine_otel": "tasks.observability.otel" in sys.modules,
    "otel_modules": sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"),
    "checks": [message.id for message in run_checks() if message.id.startswith("tasks.")],
}))
"""


def probe(tmp_path, mode: str, **environment: str) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "reliability_console.settings",
        "DJANGO_DEBUG": "1",
        "RELIABILITY_VAR_DIR": str(tmp_path),
        "OTEL_TRACES_EXPORTER": "none",
        **environment,
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# What a process tracing would import and one that does not trace must not.
TRACING_MODULES = {"opentelemetry.sdk.trace", "opentelemetry.propagate", "opentelemetry.exporter"}


def test_with_tracing_off_the_engine_imports_nothing_of_opentelemetry(tmp_path):
    found = probe(tmp_path, "sdk", RELIABILITY_TRACING="0")
    assert (found["active"], found["engine_otel"], found["checks"]) == (False, False, [])
    # With the SDK installed, redis-py imports its metrics part by itself: exactly that, and nothing the engine
    # would import to trace, is loaded.
    assert found["otel_modules"] == probe(tmp_path, "redis-only")["otel_modules"]
    assert not TRACING_MODULES & set(found["otel_modules"])


def test_with_tracing_on_the_sdk_is_imported_and_in_force(tmp_path):
    # The control of the test above: the same probe does see the tracing modules when tracing is on.
    found = probe(tmp_path, "sdk", RELIABILITY_TRACING="1")
    assert (found["active"], found["engine_otel"], found["checks"]) == (True, True, [])
    assert TRACING_MODULES - {"opentelemetry.exporter"} <= set(found["otel_modules"])


def test_with_tracing_on_and_no_sdk_nothing_is_traced_and_the_check_warns(tmp_path):
    found = probe(tmp_path, "no-sdk", RELIABILITY_TRACING="1")
    assert found == {"active": False, "engine_otel": False, "otel_modules": [], "checks": ["tasks.W002"]}


def test_the_check_names_the_missing_sdk(monkeypatch):
    monkeypatch.setattr(tracing, "sdk_installed", lambda: False)
    with override_settings(RELIABILITY_TRACING=True):
        (warning,) = [message for message in run_checks() if message.id == "tasks.W002"]
    assert "RELIABILITY_TRACING is on but the OpenTelemetry SDK" in warning.msg and "otel" in warning.hint
    with override_settings(RELIABILITY_TRACING=False):
        assert not [message for message in run_checks() if message.id == "tasks.W002"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", None),
        ("http://jaeger:16686/trace/{trace_id}", None),
        ("https://grafana.example.com/explore?traceId={trace_id}&orgId=1", None),
        ('https://grafana.example.com/explore?left={{"queries":[{{"query":"{trace_id}"}}]}}', None),
        ("jaeger:16686/trace/{trace_id}", "must be an http:// or https:// URL"),
        ("http://jaeger:16686/trace/", "must hold {trace_id} once and no other placeholder"),
        ("http://jaeger:16686/trace/{id}", "must hold {trace_id} once and no other placeholder"),
        ("http://j/{trace_id}/{trace_id}", "must hold {trace_id} once and no other placeholder"),
        ("http://j/{trace_id!r}", "must hold {trace_id} once and no other placeholder"),
        ("http://j/{trace_id", "is not a URL template"),
        (42, "is not a string"),
    ],
)
def test_a_trace_url_is_an_http_url_with_its_trace_id(value, problem):
    found = setting_rules.trace_url("RELIABILITY_TRACE_URL", value)
    assert found is None if problem is None else problem in found


def test_a_bad_trace_url_is_the_consoles_error_and_stops_the_standalone_project():
    with override_settings(RELIABILITY_TRACE_URL="http://jaeger/trace/{id}"):
        (error,) = [message for message in run_checks() if message.id == "dlq.E001"]
    assert error.msg.startswith("RELIABILITY_TRACE_URL='http://jaeger/trace/{id}' must hold {trace_id} once")
    with pytest.raises(ImproperlyConfigured, match="must be an http:// or https:// URL"):
        validate_trace_url("RELIABILITY_TRACE_URL", "ftp://jaeger/{trace_id}")


@pytest.mark.parametrize(
    ("environment", "exporters"),
    [
        ({}, ["OTLPSpanExporter"]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["ConsoleSpanExporter", "OTLPSpanExporter"]),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ["OTLPSpanExporter"]),
    ],
)
def test_the_exporters_are_the_ones_the_otel_variables_name(monkeypatch, environment, exporters):
    from tasks.observability.otel import exporters_from_environment

    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    made = exporters_from_environment()
    assert [type(exporter).__name__ for exporter in made] == exporters
    if exporters and exporters[-1] == "OTLPSpanExporter":
        assert type(made[-1]).__module__ == "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    for exporter in made:
        exporter.shutdown()


@pytest.mark.parametrize(
    ("environment", "problem"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin_json"}, "no installed package provides the span exporter 'zipkin_json'"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "no installed package provides the span exporter 'otlp_proto_grpc'"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='thrift' is not"),
    ],
)
def test_an_exporter_that_cannot_be_made_stops_start_up_naming_it(monkeypatch, environment, problem):
    from tasks.observability.otel import exporters_from_environment

    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=problem):
        exporters_from_environment()
