"""python manage.py purge_finished_tasks --older-than DAYS [--dry-run] [--batch-size N] [--pause-ratio R]: to the end.

The sweeper runs the same purge (``tasks.lifecycle.retention.finished_tasks_purge``) a
few seconds at a time with ``RELIABILITY_TASK_RETENTION_DAYS``; this command
runs it until no candidate is left, batch by batch, printing its progress.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from tasks.conf import engine_settings
from tasks.lifecycle.retention import PurgeReport, finished_tasks_purge
from tasks.management.options import count_option, days_option, ratio_option

MAX_BATCH_SIZE = 10_000
PROGRESS_SECONDS = 5.0


class Command(BaseCommand):
    help = "Delete tasks finished more than DAYS ago, with their attempts, checkpoints, ledger rows and dead letters."

    def add_arguments(self, parser):
        # Text, checked in handle(): a bad value is one CommandError line, not a usage dump.
        parser.add_argument("--older-than", metavar="DAYS", help="finished more than this many days ago (required)")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
        parser.add_argument(
            "--pause-ratio",
            default=str(engine_settings.PURGE_PAUSE_RATIO),
            help="pause after each batch this many times as long as it took (default RELIABILITY_PURGE_PAUSE_RATIO)",
        )
        parser.add_argument(
            "--batch-size",
            default=str(engine_settings.PURGE_BATCH_SIZE),
            help="tasks per transaction (default RELIABILITY_PURGE_BATCH_SIZE)",
        )

    def handle(self, *args, **options):
        older_than = days_option("--older-than", options["older_than"])
        batch_size = count_option("--batch-size", options["batch_size"], maximum=MAX_BATCH_SIZE)
        pause_ratio = ratio_option("--pause-ratio", options["pause_ratio"])
        last_progress = time.monotonic()

        def progress(report: PurgeReport) -> None:
            nonlocal last_progress
            if time.monotonic() - last_progress >= PROGRESS_SECONDS:
                last_progress = time.monotonic()
                self.stdout.write(f"{_summary(report)} so far")

        report = finished_tasks_purge(
            older_than=older_than,
            batch_size=batch_size,
            dry_run=options["dry_run"],
            pause_ratio=pause_ratio,
            on_batch=progress,
        )
        self.stdout.write(_summary(report))


def _summary(report: PurgeReport) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    tables = ", ".join(f"{label} {count:,}" for label, count in sorted(report.rows.items()))
    rate = f", {report.tasks / report.seconds:,.0f} tasks/s" if report.seconds and report.tasks else ""
    return (
        f"{verb} {report.tasks:,} tasks finished before {report.cutoff:%Y-%m-%d %H:%M:%S %Z} "
        f"({report.total_rows:,} rows{': ' + tables if tables else ''}) "
        f"in {report.batches:,} batches, {report.seconds:.1f} s{rate}"
    )
