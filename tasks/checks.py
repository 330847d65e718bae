"""System checks of the engine's configuration: ``manage.py check`` names each wrong setting in one line.

Run by every management command (and ``manage.py check``) before it acts, so a project that embeds the
engine learns of a missing ``RQ_QUEUES`` or an out-of-range value at start-up, not at its first task.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register
from django.utils.module_loading import import_string

from tasks.conf import ENGINE_SETTINGS, engine_settings

WORKER_CLASS = "tasks.delivery.worker.ReliabilityWorker"


@register()
def settings_checked(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """tasks.E001: a setting of the engine set to a value its rule refuses (type, range, pattern)."""
    return [Error(problem, id="tasks.E001") for _, problem in engine_settings.problems()]


@register()
def queues_checked(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """tasks.E002 ``RQ_QUEUES`` missing, tasks.E003 one of the engine's queues absent from it, tasks.E005
    ``RELIABILITY_QUEUE`` not one of ``RELIABILITY_QUEUES``."""
    # A wrong RELIABILITY_QUEUES is already tasks.E001; judging the rest against it would only repeat that.
    if any(setting.name in ("RELIABILITY_QUEUES", "RELIABILITY_QUEUE") for setting, _ in engine_settings.problems()):
        return []
    names = list(engine_settings.QUEUES)
    errors = []
    if engine_settings.QUEUE not in names:
        errors.append(
            Error(
                f"RELIABILITY_QUEUE={engine_settings.QUEUE!r} is not one of RELIABILITY_QUEUES {names}", id="tasks.E005"
            )
        )
    queues = getattr(settings, "RQ_QUEUES", None)
    if queues is None:
        return [*errors, Error(f"RQ_QUEUES is not set: {ENGINE_SETTINGS['RQ_QUEUES'].doc} {names}", id="tasks.E002")]
    if isinstance(queues, dict):
        missing = [name for name in names if name not in queues]
        if missing:
            errors.append(Error(f"RQ_QUEUES has no entry for the engine's queue(s) {missing}", id="tasks.E003"))
    return errors


@register()
def apps_checked(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """tasks.E004: ``django_rq`` listed before ``tasks``, so ``rqworker`` would be django-rq's own command."""
    labels = [config.label for config in apps.get_app_configs()]
    if "django_rq" in labels and labels.index("django_rq") < labels.index("tasks"):
        return [
            Error(
                "INSTALLED_APPS lists django_rq before tasks: list tasks first, or rqworker is plain django-rq's "
                "(one queue, pickle, no engine worker)",
                id="tasks.E004",
            )
        ]
    return []


@register()
def worker_class_checked(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """tasks.E006: ``RQ["WORKER_CLASS"]`` that is not the engine's worker (JSON only, the engine's jobs only)."""
    configured = (getattr(settings, "RQ", None) or {}).get("WORKER_CLASS")
    if configured is None:
        return []
    from tasks.delivery.worker import ReliabilityWorker

    try:
        worker_class = import_string(configured) if isinstance(configured, str) else configured
    except ImportError as exc:
        return [Error(f"RQ['WORKER_CLASS']={configured!r} does not import: {exc}", id="tasks.E006")]
    if not (isinstance(worker_class, type) and issubclass(worker_class, ReliabilityWorker)):
        return [Error(f"RQ['WORKER_CLASS']={configured!r} is not {WORKER_CLASS} or a subclass", id="tasks.E006")]
    return []


@register()
def schedules_checked(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """tasks.W001: a schedule declared in code whose catch-up window is within two sweep intervals.

    Slots fire on the sweeper's beat: a sweep that comes a little late on a loaded machine finds such a slot
    past its window already and counts it missed instead of running it.
    """
    from tasks import registry

    sweep = engine_settings.SWEEP_INTERVAL_SECONDS
    warnings = []
    for pipeline in registry.all_pipelines():
        for schedule in getattr(pipeline, "schedules", ()):
            window = schedule.window.total_seconds()
            if window < 2 * sweep:
                warnings.append(
                    Warning(
                        f"schedule {schedule.name!r} of pipeline {pipeline.name!r}: its catch-up window ({window:g} s)"
                        f" is within two sweep intervals ({sweep:g} s each): a late sweep counts its slots missed",
                        hint="give it a longer every or catch_up_window, or lower RELIABILITY_SWEEP_INTERVAL_SECONDS",
                        id="tasks.W001",
                    )
                )
    return warnings


@register()
def tracing_checked(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """tasks.W002: ``RELIABILITY_TRACING`` on without the OpenTelemetry SDK: nothing is traced."""
    from tasks.observability.tracing import SDK_MODULE, sdk_installed

    if engine_settings.TRACING is not True or sdk_installed():
        return []
    return [
        Warning(
            f"RELIABILITY_TRACING is on but the OpenTelemetry SDK ({SDK_MODULE}) is not installed: nothing is traced",
            hint="pip install 'reliability-console[otel]', or turn RELIABILITY_TRACING off",
            id="tasks.W002",
        )
    ]
