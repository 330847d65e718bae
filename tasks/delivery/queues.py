"""Which RQ queue a task's jobs go to: the one its pipeline names, in the priority order of the settings.

``RELIABILITY_QUEUES`` lists the engine's queues, highest priority first
(``critical``, ``default``, ``bulk``); a worker listens to all of them in that
order and always takes its next job from the first non-empty one. Every
enqueue of a task's job (submission, retries, the sweeper's re-deliveries,
operator and bulk actions) derives the queue from the task's pipeline here,
so a job delivered again lands where the first one did.
"""

from __future__ import annotations

from tasks import registry
from tasks.conf import engine_settings
from tasks.exceptions import ConfigurationError, UnknownPipeline

# The engine's own notifications (alert deliveries, completion callbacks) go first: an operator
# waiting for an alert must not wait behind a bulk backlog.
CRITICAL_QUEUE = "critical"


def queue_names() -> tuple[str, ...]:
    """The engine's queues, highest priority first (what a worker started without arguments listens to)."""
    return tuple(engine_settings.QUEUES)


def queues_above(queue: str) -> tuple[str, ...]:
    """The queues of higher priority than ``queue``, highest first (none for the first, or for one not configured)."""
    names = queue_names()
    return names[: names.index(queue)] if queue in names else ()


def default_queue() -> str:
    return engine_settings.QUEUE


def queue_check(queue: str, *, pipeline: str) -> str:
    """``queue`` if it is one of the configured queues, else a ``ConfigurationError`` naming both."""
    if queue not in queue_names():
        raise ConfigurationError(
            f"pipeline {pipeline!r}: queue {queue!r} is not one of the configured queues {list(queue_names())}"
        )
    return queue


def queue_for_pipeline(pipeline: str) -> str:
    """The queue of ``pipeline``'s jobs; the default queue when no such pipeline is registered here.

    A process may lack a pipeline its database has tasks of (a module not
    deployed yet): its jobs still go somewhere a worker listens, and that
    worker fails the task as an unknown pipeline, as before.
    """
    try:
        return registry.get(pipeline).queue
    except UnknownPipeline:
        return default_queue()
