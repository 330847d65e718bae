"""python manage.py purge_idempotency_records: delete expired records now (the sweeper also does)."""

from django.core.management.base import BaseCommand

from tasks.submission.idempotency import idempotency_purge_expired


class Command(BaseCommand):
    help = "Delete expired idempotency records."

    def handle(self, *args, **options):
        total = 0
        while deleted := idempotency_purge_expired():
            total += deleted
        self.stdout.write(f"deleted {total} expired idempotency records")
