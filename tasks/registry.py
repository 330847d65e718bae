"""The pipeline registry: the only pipelines (and so the only code) a worker will run."""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks.exceptions import ConfigurationError, UnknownPipeline

if TYPE_CHECKING:
    from tasks.pipelines import Pipeline

_PIPELINES: dict[str, Pipeline] = {}
ENGINE_DIR = Path(__file__).resolve().parent


def register(pipeline: Pipeline) -> None:
    existing = _PIPELINES.get(pipeline.name)
    if existing is not None and existing is not pipeline:
        raise ConfigurationError(f"a pipeline named {pipeline.name!r} is already registered")
    _PIPELINES[pipeline.name] = pipeline


def register_once(name: str, build: Callable[[], Pipeline]) -> Pipeline:
    """The pipeline registered as ``name``, built and registered by ``build`` the first time (a built-in's way)."""
    existing = _PIPELINES.get(name)
    if existing is not None:
        return existing
    pipeline = build()
    register(pipeline)
    return pipeline


def unregister(name: str) -> None:
    _PIPELINES.pop(name, None)


def get(name: str) -> Pipeline:
    try:
        return _PIPELINES[name]
    except KeyError:
        raise UnknownPipeline(f"no pipeline named {name!r} is registered", details={"pipeline": name}) from None


def names() -> list[str]:
    return sorted(_PIPELINES)


def all_pipelines() -> list[Pipeline]:
    """Every registered pipeline, by name."""
    return [_PIPELINES[name] for name in sorted(_PIPELINES)]


def load_pipeline_modules() -> None:
    """Import every module of ``RELIABILITY_PIPELINE_MODULES``, registering its pipelines.

    Called from ``TasksConfig.ready()``, so web, workers and the sweeper all
    stop at start-up when one cannot be imported, whatever it raised, with an
    ``ImproperlyConfigured`` naming the module and the cause on one line
    (a worker that started anyway would fail each of that pipeline's tasks).
    """
    modules = list(settings.RELIABILITY_PIPELINE_MODULES)
    if settings.RELIABILITY_ENABLE_BENCH_PIPELINES:
        modules.append("tasks.bench_pipelines")
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ImproperlyConfigured(
                f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: {import_failure(exc)}"
            ) from exc


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
