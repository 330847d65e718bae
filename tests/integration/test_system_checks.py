"""``manage.py check`` names each missing or wrong setting of the engine and the console in one line (issue 20)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

from tasks.delivery.enqueue import get_queue
from tasks.delivery.worker import ReliabilityJob

ROOT = Path(__file__).resolve().parent.parent.parent


def errors(**overrides) -> list[tuple[str, str]]:
    """The engine's and the console's messages, but the schedule warning (tasks.W001): that one is about the
    pipelines registered, and other tests' modules (a schedule of every 2 s) stay registered in this process."""
    with override_settings(**overrides):
        return [
            (message.id, message.msg)
            for message in run_checks()
            if message.id.split(".")[0] in ("tasks", "dlq") and message.id != "tasks.W001"
        ]


def schedule_warnings(*pipelines: str, **overrides) -> list[tuple[str, str]]:
    """tasks.W001 about ``pipelines``."""
    with override_settings(**overrides):
        return [
            (message.id, message.msg)
            for message in run_checks()
            if message.id == "tasks.W001" and any(f"of pipeline {name!r}" in message.msg for name in pipelines)
        ]


def test_the_standalone_project_has_no_issue():
    assert errors() == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"RELIABILITY_LEASE_SECONDS": 0}, ("tasks.E001", "RELIABILITY_LEASE_SECONDS=0 must be at least 1")),
        ({"RELIABILITY_LEASE_SECONDS": "30"}, ("tasks.E001", "RELIABILITY_LEASE_SECONDS='30' is not a number")),
        ({"RELIABILITY_MAX_CRASHES": 2.5}, ("tasks.E001", "RELIABILITY_MAX_CRASHES=2.5 is not an integer")),
        (
            {"RELIABILITY_PURGE_BATCH_SIZE": 10001},
            ("tasks.E001", "RELIABILITY_PURGE_BATCH_SIZE=10001 must be at most 10000"),
        ),
        (
            {"RELIABILITY_REDACT_PATTERN": "a|"},
            ("tasks.E001", "RELIABILITY_REDACT_PATTERN: 'a|' matches the empty string, so it would match everything"),
        ),
        (
            {"RELIABILITY_PIPELINE_MODULES": "shop.pipelines"},
            ("tasks.E001", "RELIABILITY_PIPELINE_MODULES='shop.pipelines' is not a list of names"),
        ),
        (
            {"RELIABILITY_CALLBACK_ALLOWED_HOSTS": ["https://hooks.example.com"]},
            (
                "tasks.E001",
                "RELIABILITY_CALLBACK_ALLOWED_HOSTS: 'https://hooks.example.com' is not a host or host:port "
                "(e.g. hooks.example.com:443)",
            ),
        ),
        (
            {"REPORT_PLATFORM_URL": "ftp://x"},
            ("tasks.E001", "REPORT_PLATFORM_URL='ftp://x' must be an http:// or https:// URL"),
        ),
        (
            {"RELIABILITY_BULK_CANARY_MAX_FAILURE_RATE": 1.5},
            ("dlq.E001", "RELIABILITY_BULK_CANARY_MAX_FAILURE_RATE=1.5 must be at most 1"),
        ),
        (
            {"RELIABILITY_CONSOLE_URL": "console.example.com"},
            ("dlq.E001", "RELIABILITY_CONSOLE_URL='console.example.com' must be an http:// or https:// URL"),
        ),
        (
            {"RELIABILITY_METRICS_ALLOWED_NETWORKS": ["10.0.0.0/33"]},
            (
                "dlq.E001",
                "RELIABILITY_METRICS_ALLOWED_NETWORKS: '10.0.0.0/33' is not an IP network (use CIDR, e.g. 10.0.0.0/8)",
            ),
        ),
        (
            {"RELIABILITY_ATTEMPT_LOG_LEVEL": "LOUD"},
            ("tasks.E001", "RELIABILITY_ATTEMPT_LOG_LEVEL='LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ),
        (
            {"RELIABILITY_ATTEMPT_LOG_LINES": 20000},
            ("tasks.E001", "RELIABILITY_ATTEMPT_LOG_LINES=20000 must be at most 10000"),
        ),
        (
            {"RELIABILITY_QUEUE": "urgent"},
            (
                "tasks.E005",
                "RELIABILITY_QUEUE='urgent' is not one of RELIABILITY_QUEUES ['critical', 'default', 'bulk']",
            ),
        ),
        (
            {"RQ": {"WORKER_CLASS": "rq.worker.Worker"}},
            (
                "tasks.E006",
                "RQ['WORKER_CLASS']='rq.worker.Worker' is not tasks.delivery.worker.ReliabilityWorker or a subclass",
            ),
        ),
    ],
)
def test_a_wrong_value_is_one_error_naming_it(overrides, expected):
    assert errors(**overrides) == [expected]


def test_rq_queues_missing_or_without_an_engine_queue(settings):
    queues = settings.RQ_QUEUES
    settings.RQ_QUEUES = {"default": queues["default"]}
    assert errors() == [("tasks.E003", "RQ_QUEUES has no entry for the engine's queue(s) ['critical', 'bulk']")]
    del settings.RQ_QUEUES
    assert errors() == [
        (
            "tasks.E002",
            "RQ_QUEUES is not set: django-rq's queues; the engine needs one entry per queue of RELIABILITY_QUEUES "
            "['critical', 'default', 'bulk']",
        )
    ]


def test_django_rq_before_tasks(monkeypatch):
    configs = list(apps.get_app_configs())
    tasks, django_rq = apps.get_app_config("tasks"), apps.get_app_config("django_rq")
    configs.remove(django_rq)
    configs.insert(configs.index(tasks), django_rq)
    monkeypatch.setattr(apps, "get_app_configs", lambda: configs)
    assert [identity for identity, _ in errors()] == ["tasks.E004"]
    assert "INSTALLED_APPS lists django_rq before tasks" in errors()[0][1]


def test_call_command_check_fails_on_an_error():
    from django.core.management.base import SystemCheckError

    with override_settings(RELIABILITY_SWEEP_INTERVAL_SECONDS=0), pytest.raises(SystemCheckError, match=r"tasks\.E001"):
        call_command("check")


def test_the_engines_queues_speak_json_with_its_job_class_whatever_rq_queues_says(settings):
    queues = {name: {**config} for name, config in settings.RQ_QUEUES.items()}
    for config in queues.values():
        config["SERIALIZER"] = "rq.serializers.DefaultSerializer"
        config["DEFAULT_TIMEOUT"] = 180
    settings.RQ_QUEUES = queues
    settings.RQ = {key: value for key, value in settings.RQ.items() if key != "JOB_CLASS"}
    queue = get_queue("default")
    assert queue.serializer.__name__ == "JSONSerializer"
    assert queue.job_class is ReliabilityJob and queue._default_timeout == -1


def manage_py_check(drop: str) -> subprocess.CompletedProcess:
    environment = {
        "PATH": os.environ["PATH"],
        "DJANGO_SECRET_KEY": "x",
        "DJANGO_SETTINGS_MODULE": "tests.check_settings",
        "RC_CHECK_DROP": drop,
        "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


@pytest.mark.processes
def test_manage_py_check_with_rq_queues_missing_is_one_error_line():
    result = manage_py_check("RQ_QUEUES")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    error_lines = [line for line in lines if "tasks.E" in line or "dlq.E" in line]
    assert len(error_lines) == 1 and "RQ_QUEUES is not set" in error_lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.processes
def test_manage_py_check_with_dlq_but_no_tasks_is_one_line():
    result = manage_py_check("tasks")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        'configuration error: INSTALLED_APPS lists dlq without tasks: the console needs the engine; add "tasks" '
        'before "dlq"'
    )


def test_a_code_schedule_whose_window_is_within_two_sweeps_is_warned_about():
    from datetime import timedelta

    from tasks import Pipeline, Schedule, registry

    tight = Pipeline("checks_tight", schedules=[Schedule(every=timedelta(seconds=8), name="checks-8s")])
    tight.step(lambda ctx: None, name="work")
    roomy = Pipeline(
        "checks_roomy",
        schedules=[Schedule(every=timedelta(seconds=8), name="checks-8s-late", catch_up_window=timedelta(minutes=1))],
    )
    roomy.step(lambda ctx: None, name="work")
    try:
        warned = schedule_warnings("checks_tight", "checks_roomy")
        assert warned == [
            (
                "tasks.W001",
                "schedule 'checks-8s' of pipeline 'checks_tight': its catch-up window (8 s) is within two sweep "
                "intervals (5 s each): a late sweep counts its slots missed",
            )
        ]
        assert schedule_warnings("checks_tight", "checks_roomy", RELIABILITY_SWEEP_INTERVAL_SECONDS=2) == []
    finally:
        registry.unregister("checks_tight")
        registry.unregister("checks_roomy")
