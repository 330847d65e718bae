"""The pipeline registry: the only pipelines (and so the only code) a worker will run."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks.exceptions import ConfigurationError, UnknownPipeline

if TYPE_CHECKING:
    from tasks.pipelines import Pipeline

_PIPELINES: dict[str, Pipeline] = {}


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


def load_pipeline_modules() -> None:
    modules = list(settings.RELIABILITY_PIPELINE_MODULES)
    if settings.RELIABILITY_ENABLE_BENCH_PIPELINES:
        modules.append("tasks.bench_pipelines")
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(f"RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: {exc}") from exc
