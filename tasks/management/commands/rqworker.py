"""``manage.py rqworker [queue …]``: django-rq's worker command, listening to every engine queue by default.

With no queue named, the worker listens to all of ``RELIABILITY_QUEUES`` in
priority order (``critical default bulk``), not to django-rq's ``default``
alone, which would leave the critical and bulk queues without a worker. Named
queues are checked against the configuration first, so a typo stops the
command with a message instead of starting a worker that waits on a queue
nobody enqueues to.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from django_rq.management.commands import rqworker

from tasks.delivery.queues import queue_names

RELIABILITY_WORKER_CLASS = "tasks.delivery.worker.ReliabilityWorker"


class Command(rqworker.Command):
    help = "Run an RQ worker on the given queues, highest priority first (default: every engine queue in order)."

    def handle(self, *args, **options):
        unknown = [name for name in args if name not in queue_names()]
        if unknown:
            raise CommandError(f"unknown queue(s) {unknown}: the configured queues are {list(queue_names())}")
        # Without RQ["WORKER_CLASS"] django-rq would start RQ's own Worker, which unpickles: the engine's worker
        # reads only JSON and runs only the engine's job class (tasks.checks refuses any other configured class).
        if not options.get("worker_class") and "WORKER_CLASS" not in getattr(settings, "RQ", {}):
            options["worker_class"] = RELIABILITY_WORKER_CLASS
        # The queues it builds read and write JSON too (django-rq's default --serializer is pickle).
        options["serializer"] = "rq.serializers.JSONSerializer"
        return super().handle(*(args or queue_names()), **options)
