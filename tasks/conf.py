"""The engine's settings, each with its default and its rule, read lazily from Django's settings.

``engine_settings.LEASE_SECONDS`` reads ``settings.RELIABILITY_LEASE_SECONDS`` on every access (so
``override_settings`` applies) and falls back to the default below: a project that embeds the engine
sets only what it wants to change. The standalone project (``reliability_console/settings.py``) sets
every name from the environment with these same defaults. ``tasks.checks`` judges each set value with
its rule (``manage.py check``), so a wrong one is one line at start-up, not an error at first use.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from tasks import setting_rules as rules

# The default of a setting the project must give (django-rq's RQ_QUEUES): there is no sensible one.
REQUIRED = object()
PREFIX = "RELIABILITY_"


@dataclass(frozen=True)
class Setting:
    """One Django setting an app reads: its name, default, one-line meaning and rule."""

    name: str
    default: Any
    doc: str
    rule: rules.Rule | None = None


def _prefixed(**entries: tuple[Any, str, rules.Rule | None]) -> dict[str, Setting]:
    return {key: Setting(PREFIX + key, *entry) for key, entry in entries.items()}


class AppSettings:
    """Attribute access to an app's settings: the project's value when it sets one, else the default."""

    def __init__(self, settings: Mapping[str, Setting]) -> None:
        self._settings = dict(settings)

    def __getattr__(self, key: str) -> Any:
        try:
            setting = self._settings[key]
        except KeyError:
            raise AttributeError(f"no such setting: {key}") from None
        value = getattr(django_settings, setting.name, REQUIRED)
        if value is not REQUIRED:
            return value
        if setting.default is REQUIRED:
            raise ImproperlyConfigured(f"{setting.name} is not set: {setting.doc}")
        # A copy: a caller that changes a default list must not change it for the whole process.
        return copy.copy(setting.default)

    def __iter__(self) -> Iterator[Setting]:
        return iter(self._settings.values())

    def __dir__(self) -> list[str]:
        return sorted(self._settings)

    def is_set(self, setting: Setting) -> bool:
        return hasattr(django_settings, setting.name)

    def problems(self) -> Iterator[tuple[Setting, str]]:
        """Each setting the project set to a value its rule refuses, with the problem (one line)."""
        for setting in self:
            if setting.rule is None or not self.is_set(setting):
                continue
            problem = setting.rule(setting.name, getattr(django_settings, setting.name))
            if problem:
                yield setting, problem


number = rules.Number
ENGINE_SETTINGS: dict[str, Setting] = {
    **_prefixed(
        QUEUES=(
            ("critical", "default", "bulk"),
            "the engine's RQ queues, highest priority first; a worker listens to them in this order",
            rules.names,
        ),
        QUEUE=("default", "the queue of a pipeline that names none (one of QUEUES)", rules.text),
        LEASE_SECONDS=(30, "lease length; a dead worker's task is resumed after this", number(minimum=1)),
        SWEEP_INTERVAL_SECONDS=(5, "the sweeper's period", number(minimum=0.1)),
        MAX_CRASHES=(3, "lease expirations before a task fails with crash_loop", number(minimum=1, integer=True)),
        REDELIVERY_GRACE_SECONDS=(
            10,
            "a QUEUED task older than this whose job is gone from Redis is re-delivered",
            number(minimum=0),
        ),
        COMPENSATION_TIMEOUT_SECONDS=(30, "timeout of each compensation attempt", number(minimum=0.1)),
        DEFAULT_STEP_TIMEOUT_SECONDS=(60, "step timeout when neither step nor pipeline sets one", number(minimum=0.1)),
        PIPELINE_MODULES=([], "modules that declare pipelines, besides each app's pipelines.py", rules.names),
        REDACT_PATTERN=(
            r"password|passwd|token|secret|authorization|api[_-]?key|card|cvv",
            "a regex of key names whose values are redacted",
            rules.regex_problem,
        ),
        REDACT_PATTERNS=([], "regexes of secret-shaped text, added to the built-in redaction rules", rules.regex_list),
        IDEMPOTENCY_TTL_SECONDS=(86400, "how long an idempotency record is kept", number(minimum=1)),
        IDEMPOTENCY_WAIT_SECONDS=(5, "how long a duplicate waits for the first request", number(minimum=0)),
        IDEMPOTENCY_LOCK_SECONDS=(60, "after this an unfinished request's key may be taken over", number(minimum=1)),
        MAX_REQUEST_BYTES=(262144, "largest accepted API request body", number(minimum=1024, integer=True)),
        DATABASE_STORED_FUNCTIONS=(
            True,
            "behind a transaction pooler, step writes and claims go through PL/pgSQL functions it creates",
            rules.boolean,
        ),
        BATCH_DELIVERY_SIZE=(
            20,
            "tasks of a batch submission delivered per RQ job, run in turn (1: a job each)",
            number(minimum=1, integer=True),
        ),
        CALLBACK_ALLOWED_HOSTS=([], "hosts a callback_url may name (empty: callbacks off)", rules.hosts),
        CALLBACK_SECRET_GRACE_SECONDS=(86400, "how long a rotated signing secret still signs", number(minimum=0)),
        CALLBACK_MAX_ATTEMPTS=(8, "attempts to deliver one callback", number(minimum=1, maximum=100, integer=True)),
        CALLBACK_RETRY_BASE_SECONDS=(5, "the first callback retry's backoff ceiling", number(minimum=0)),
        CALLBACK_DEADLINE_SECONDS=(86400, "a callback not delivered by then is dead-lettered", number(minimum=1)),
        TASK_RETENTION_DAYS=(30, "days finished tasks are kept (0: forever)", number(minimum=0, integer=True)),
        DLQ_RETENTION_DAYS=(0, "days resolved dead letters are kept (0: forever)", number(minimum=0, integer=True)),
        PURGE_BATCH_SIZE=(500, "tasks per purge transaction", number(minimum=1, maximum=10000, integer=True)),
        PURGE_INTERVAL_SECONDS=(60, "how often the sweeper runs the purges", number(minimum=1)),
        PURGE_PAUSE_RATIO=(1, "pause after each purge batch, times as long as it took", number(minimum=0, maximum=100)),
        ATTEMPT_LOG_LINES=(
            200,
            "lines a step's attempt keeps of what it logged (0: none kept); later lines are counted",
            number(minimum=0, maximum=10000, integer=True),
        ),
        ATTEMPT_LOG_BYTES=(
            65536,
            "bytes of message text an attempt keeps of what it logged; later lines are counted",
            number(minimum=1024, maximum=1048576, integer=True),
        ),
        ATTEMPT_LOG_LEVEL=("INFO", "the least severe level an attempt's log keeps", rules.log_level),
        TRACING=(
            False,
            "OpenTelemetry traces of submissions, runs, attempts and ctx.http calls (needs the SDK: the otel extra; "
            "configured by the OTEL_* environment variables)",
            rules.boolean,
        ),
    ),
    "DATABASE_POOLER": Setting(
        "DATABASE_POOLER",
        "none",
        "'transaction' when every connection goes through a transaction pooler",
        rules.text,
    ),
    "REPORT_PLATFORM_URL": Setting(
        "REPORT_PLATFORM_URL", "http://127.0.0.1:8765", "the demo's report platform", rules.http_url
    ),
    "RQ_QUEUES": Setting(
        "RQ_QUEUES",
        REQUIRED,
        "django-rq's queues; the engine needs one entry per queue of RELIABILITY_QUEUES",
        rules.mapping,
    ),
}

engine_settings = AppSettings(ENGINE_SETTINGS)
