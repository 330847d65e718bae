"""python manage.py seed_scale_data --tasks N --dlq-items M: millions of realistic rows, for benchmarks.

PostgreSQL only. The command parses its options, runs
``devtools.scale_data.service.scale_data_seed`` and prints its progress and the
rows per table; what the rows look like is in ``devtools.scale_data.shape``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from devtools.scale_data.service import SeedRefused, scale_data_seed


def _positive(name: str, value) -> int:
    try:
        number = int(str(value).replace("_", "").replace(",", ""))
    except ValueError:
        raise CommandError(f"{name} must be a positive integer, not {value!r}") from None
    if number < 1:
        raise CommandError(f"{name} must be a positive integer, not {value!r}")
    return number


class Command(BaseCommand):
    help = "Fill a PostgreSQL database with millions of realistic tasks and DLQ items, for benchmarks."

    def add_arguments(self, parser):
        # Parsed as text and checked in handle(), so a bad value is one CommandError line, not a usage dump.
        parser.add_argument("--tasks", required=True, help="number of tasks, e.g. 5000000")
        parser.add_argument("--dlq-items", required=True, help="number of DLQ items, e.g. 1000000")
        parser.add_argument("--batch", default="200000", help="rows per INSERT statement (default 200000)")
        parser.add_argument("--seed", default="1", help="seed of the distributions (default 1)")
        parser.add_argument("--force", action="store_true", help="seed even if the tables already hold data")

    def handle(self, *args, **options):
        try:
            counts = scale_data_seed(
                tasks=_positive("--tasks", options["tasks"]),
                dlq_items=_positive("--dlq-items", options["dlq_items"]),
                batch=_positive("--batch", options["batch"]),
                seed=_positive("--seed", options["seed"]),
                force=options["force"],
                progress=lambda line: self.stdout.write(line),
            )
        except SeedRefused as refused:
            raise CommandError(str(refused)) from refused
        self.stdout.write(", ".join(f"{table}: {count:,} rows" for table, count in counts.items()))
