"""python manage.py task_states ID [ID …]: print {id: state} as JSON."""

from __future__ import annotations

import json
import uuid

from django.core.management.base import BaseCommand, CommandError

from tasks.selectors.tasks import task_states


class Command(BaseCommand):
    help = "Print the state of the given tasks as a JSON object."

    def add_arguments(self, parser):
        parser.add_argument("task_ids", nargs="+")

    def handle(self, *args, **options):
        try:
            ids = [uuid.UUID(raw) for raw in options["task_ids"]]
        except ValueError:
            raise CommandError("task ids must be UUIDs") from None
        self.stdout.write(json.dumps(task_states(task_ids=ids), sort_keys=True))
