"""python manage.py purge_audit_log --older-than DAYS [--dry-run]: delete old audit entries, auditing the deletion.

The sweeper runs the same purge (``dlq.audit.audit_entries_purge``) a few
seconds at a time when ``RELIABILITY_AUDIT_RETENTION_DAYS`` is set; this
command runs it until no older entry is left. Each transaction deletes a
batch and appends an ``audit_purged`` entry with the count and the cutoff.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from dlq.audit import AuditPurgeReport, audit_entries_purge
from tasks.conf import engine_settings
from tasks.management.options import days_option


class Command(BaseCommand):
    help = "Delete audit entries older than DAYS (each deletion is itself audited)."

    def add_arguments(self, parser):
        # Text, checked in handle(): a bad value is one CommandError line, not a usage dump.
        parser.add_argument("--older-than", metavar="DAYS", help="created more than this many days ago (required)")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")

    def handle(self, *args, **options):
        older_than = days_option("--older-than", options["older_than"])
        report = audit_entries_purge(
            older_than=older_than, dry_run=options["dry_run"], pause_ratio=engine_settings.PURGE_PAUSE_RATIO
        )
        self.stdout.write(_summary(report))


def _summary(report: AuditPurgeReport) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    return (
        f"{verb} {report.entries:,} audit entries created before {report.cutoff:%Y-%m-%d %H:%M:%S %Z} "
        f"in {report.batches:,} batches, {report.seconds:.1f} s"
    )
