"""What the engine runs, registered: pipelines, RQ entry points, sweeper chores.

The pipelines are the only ones (and so the only code) a worker will run. The entry points are the only
functions a worker's job may name (``tasks.delivery.worker.ReliabilityJob`` refuses any other). The chores are the
periodic work other apps add to every sweep (``tasks.delivery.sweeper`` runs them). Another app (the console) adds what
it runs here, from its ``AppConfig.ready()``.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.apps import AppConfig, apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from tasks.conf import engine_settings
from tasks.exceptions import ConfigurationError, UnknownPipeline


class RegisteredPipeline(Protocol):
    """A ``tasks.pipelines.pipeline.Pipeline`` as the registry holds it. A Pipeline registers itself here when it is
    declared, so this module does not import it and names only what it and ``tasks.delivery.queues`` read of one."""

    name: str
    queue: str


_PIPELINES: dict[str, RegisteredPipeline] = {}
ENGINE_DIR = Path(__file__).resolve().parent


def register(pipeline: RegisteredPipeline) -> None:
    existing = _PIPELINES.get(pipeline.name)
    if existing is not None and existing is not pipeline:
        raise ConfigurationError(f"a pipeline named {pipeline.name!r} is already registered")
    _PIPELINES[pipeline.name] = pipeline


def register_once(name: str, build: Callable[[], RegisteredPipeline]) -> RegisteredPipeline:
    """The pipeline registered as ``name``, built and registered by ``build`` the first time (a built-in's way)."""
    existing = _PIPELINES.get(name)
    if existing is not None:
        return existing
    pipeline = build()
    register(pipeline)
    return pipeline


def unregister(name: str) -> None:
    _PIPELINES.pop(name, None)


def get(name: str) -> RegisteredPipeline:
    try:
        return _PIPELINES[name]
    except KeyError:
        raise UnknownPipeline(f"no pipeline named {name!r} is registered", details={"pipeline": name}) from None


def names() -> list[str]:
    return sorted(_PIPELINES)


def all_pipelines() -> list[RegisteredPipeline]:
    """Every registered pipeline, by name."""
    return [_PIPELINES[name] for name in sorted(_PIPELINES)]


# The module an installed app declares its pipelines in, found as Django's admin finds ``admin.py``.
APP_PIPELINES_MODULE = "pipelines"


def load_pipeline_modules() -> None:
    """Import every installed app's ``pipelines.py`` and every module of ``RELIABILITY_PIPELINE_MODULES``.

    Called from ``TasksConfig.ready()``, so web, workers and the sweeper all
    stop at start-up when one cannot be imported, whatever it raised, with an
    ``ImproperlyConfigured`` naming the module and the cause on one line
    (a worker that started anyway would fail each of that pipeline's tasks).
    The engine registers no pipeline of a deployment by default: the demo and
    the bench pipelines are modules the standalone project lists.
    """
    app_pipelines_discover(apps.get_app_configs())
    # No setting is no extra module: an embedding project may declare all its pipelines in its apps.
    for module in engine_settings.PIPELINE_MODULES:
        _pipeline_module_import(module, source="RELIABILITY_PIPELINE_MODULES")


def app_pipelines_discover(app_configs: Iterable[AppConfig]) -> None:
    """Import ``<app>.pipelines`` of each app that has one (``autodiscover_modules``, with the engine's errors)."""
    for app_config in app_configs:
        # Asked of the package first, as autodiscover_modules does: an app without the module is skipped, but an
        # ImportError raised inside an existing one is that module's failure and stops the process.
        if module_has_submodule(app_config.module, APP_PIPELINES_MODULE):
            _pipeline_module_import(f"{app_config.name}.{APP_PIPELINES_MODULE}", source="INSTALLED_APPS")


def _pipeline_module_import(module: str, *, source: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise ImproperlyConfigured(f"{source}: cannot import {module!r}: {import_failure(exc)}") from exc


def import_failure(exc: Exception) -> str:
    """One line saying what went wrong in an import: the error, and where it was raised unless that is obvious."""
    if isinstance(exc, ImportError | SyntaxError):
        # Their own message says it all: "No module named 'x'", "invalid syntax (orders.py, line 3)".
        return f"{type(exc).__name__}: {exc}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<") and frame.filename != importlib.__file__
    ]
    if not frames:
        return f"{type(exc).__name__}: {exc}"
    # The innermost line of the pipeline author's code rather than the
    # engine's: a ConfigurationError raised by Pipeline(...) points at the declaration.
    authors = [frame for frame in frames if not Path(frame.filename).is_relative_to(ENGINE_DIR)]
    where = (authors or frames)[-1]
    return f"{type(exc).__name__}: {exc} ({where.filename}, line {where.lineno})"


# --- RQ entry points -----------------------------------------------------------------------------------------

# The engine's own: a task's delivery (tasks.delivery.jobs.run_task).
RUN_TASK_ENTRY_POINT = "tasks.delivery.jobs.run_task"
# A job that runs several tasks of one batch in turn, each claimed on its own (tasks.submission.batches).
RUN_TASKS_ENTRY_POINT = "tasks.delivery.jobs.run_tasks"
_ENTRY_POINTS: set[str] = {RUN_TASK_ENTRY_POINT, RUN_TASKS_ENTRY_POINT}
# The same entry points by the paths earlier releases enqueued them under (tasks.jobs, before tasks/delivery/): a job
# outlives a deploy in Redis, and a worker runs it by its current path instead of refusing it (tasks.moved).
LEGACY_ENTRY_POINTS = {"tasks.jobs.run_task": RUN_TASK_ENTRY_POINT, "tasks.jobs.run_tasks": RUN_TASKS_ENTRY_POINT}


def entry_point_register(name: str) -> None:
    """Allow workers to run the function ``name`` (a dotted path), e.g. a console's background job."""
    _ENTRY_POINTS.add(name)


def entry_point_current(name: str | None) -> str | None:
    """The path a job's function ``name`` has in this release (an entry point's old path gives its new one)."""
    return LEGACY_ENTRY_POINTS.get(name, name) if name else name


def entry_point_allowed(name: str | None) -> bool:
    """Whether a job naming the function ``name`` may run in a worker."""
    return name in _ENTRY_POINTS


# --- sweeper chores ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chore:
    """Periodic work another app adds to the sweeper; ``run`` returns how many things it did."""

    name: str
    run: Callable[[], int]
    # None: on every sweep (sweep_once); seconds: from the sweeper loop, at most this often.
    interval: float | None = None


_CHORES: dict[str, Chore] = {}


def chore_register(chore: Chore) -> None:
    """Add ``chore`` to every sweep (idempotent per name: the last registration wins)."""
    _CHORES[chore.name] = chore


def chores() -> list[Chore]:
    """The registered chores, in the order they were first registered."""
    return list(_CHORES.values())
