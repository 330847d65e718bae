"""``manage.py rqworker [queue …]``: django-rq's worker command, listening to every engine queue by default.

With no queue named, the worker listens to all of ``RELIABILITY_QUEUES`` in
priority order (``critical default bulk``), not to django-rq's ``default``
alone, which would leave the critical and bulk queues without a worker. Named
queues are checked against the configuration first, so a typo stops the
command with a message instead of starting a worker that waits on a queue
nobody enqueues to.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django_rq.management.commands import rqworker

from tasks.queues import queue_names


class Command(rqworker.Command):
    help = "Run an RQ worker on the given queues, highest priority first (default: every engine queue in order)."

    def handle(self, *args, **options):
        unknown = [name for name in args if name not in queue_names()]
        if unknown:
            raise CommandError(f"unknown queue(s) {unknown}: the configured queues are {list(queue_names())}")
        return super().handle(*(args or queue_names()), **options)
