"""python manage.py seed_finished_tasks --tasks N [--steps S] [--age-days D]: old finished tasks, for the purge bench.

PostgreSQL only. Parses its options, runs
``devtools.scale_data.finished.finished_tasks_seed`` and prints its progress
and the rows per table.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from devtools.management.commands.seed_scale_data import _positive
from devtools.scale_data.finished import finished_tasks_seed
from devtools.scale_data.service import SeedRefused


class Command(BaseCommand):
    help = "Add old finished tasks with their attempts, checkpoints, ledger rows and resolved dead letters."

    def add_arguments(self, parser):
        # Parsed as text and checked in handle(), so a bad value is one CommandError line, not a usage dump.
        parser.add_argument("--tasks", required=True, help="number of tasks, e.g. 1000000")
        parser.add_argument("--steps", default="4", help="steps per task: attempts, checkpoints, ledger rows (4)")
        parser.add_argument("--age-days", default="60", help="the newest finished this many days ago (60)")
        parser.add_argument("--batch", default="100000", help="tasks per statement (default 100000)")

    def handle(self, *args, **options):
        try:
            counts = finished_tasks_seed(
                tasks=_positive("--tasks", options["tasks"]),
                steps=_positive("--steps", options["steps"]),
                age_days=_positive("--age-days", options["age_days"]),
                batch=_positive("--batch", options["batch"]),
                progress=lambda line: self.stdout.write(line),
            )
        except SeedRefused as refused:
            raise CommandError(str(refused)) from refused
        self.stdout.write(", ".join(f"{table}: {count:,} rows" for table, count in counts.items()))
