"""Tracing's edges in one process (issue 24, point 1): off, nothing of OpenTelemetry is imported; the settings
are checked; a task's page links to its trace. The traces themselves: tests/acceptance/test_tracing_live.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.test import Client, override_settings

from tasks import tracing
from tasks.models import Task
from tasks.models.door import door_forced
from tasks.submission import task_submit

ROOT = Path(__file__).resolve().parent.parent.parent
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_with_tracing_off_a_task_runs_without_importing_opentelemetry():
    # redis-py (8) imports a part of OpenTelemetry itself when it is installed: what counts is that running an
    # attempt and submitting add nothing to what Django's set-up imported, and no instrumentation or exporter.
    script = textwrap.dedent(
        """
        import sys, django
        django.setup()
        before = {m for m in sys.modules if m.startswith("opentelemetry")}
        from tasks import tracing
        from tasks.context import StepContext
        from tasks.attempts import attempt_run
        ctx = StepContext(task_id="t", pipeline="p", step="s", input={}, outputs={}, deadline=None,
                          call_deadline=9e12, attempt=1, generation=0)
        attempt_run(lambda ctx: 1, ctx, kind="step", step_index=0, worker="w", timeout=5)
        assert tracing.tracer() is None and tracing.submission_context("p") is None
        after = {m for m in sys.modules if m.startswith("opentelemetry")}
        ours = ("opentelemetry.instrumentation", "opentelemetry.exporter")
        print(sorted(after - before), sorted(m for m in after if m.startswith(ours)))
        """
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "reliability_console.settings", "RELIABILITY_TRACING": "0"}
    env.setdefault("DJANGO_SECRET_KEY", "x" * 60)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[] []"


def test_tracing_on_without_the_sdk_is_a_warning(monkeypatch):
    monkeypatch.setattr(tracing, "sdk_installed", lambda: False)
    with override_settings(RELIABILITY_TRACING=True):
        warned = [message.id for message in run_checks() if message.id == "tasks.W002"]
    assert warned == ["tasks.W002"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("http://jaeger:16686/trace/", "must name {trace_id}"),
        ("jaeger/{trace_id}", "must be an http:// or https:// URL"),
    ],
)
def test_a_bad_trace_url_is_an_error_naming_it(value, says):
    with override_settings(RELIABILITY_TRACE_URL=value):
        errors = [message.msg for message in run_checks() if message.id == "tasks.E001"]
    assert any("RELIABILITY_TRACE_URL" in error and says in error for error in errors), errors


@pytest.mark.django_db
def test_the_task_page_links_to_its_trace_when_a_trace_url_is_set(clean_redis):
    task = task_submit(pipeline="report", input={"user_id": "alice", "topic": "t"})
    with door_forced():
        Task.objects.filter(pk=task.pk).update(trace_context={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    page = staff.get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert TRACE in page and "jaeger" not in page
    with override_settings(RELIABILITY_TRACE_URL="http://jaeger:16686/trace/{trace_id}"):
        page = staff.get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert f'href="http://jaeger:16686/trace/{TRACE}"' in page
    assert tracing.trace_id({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) is None
