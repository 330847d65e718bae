"""python manage.py submit_demo_tasks: a handful of report tasks that succeed, retry and fail."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from tasks.exceptions import ReliabilityError
from tasks.submission.submit import task_submit

# (user, topic): demo-broke has no quota at the simulator (402 -> compensation
# and a DLQ item); demo-flaky meets scripted 5xx and 429 faults first.
DEMO_REQUESTS = [
    ("demo-alice", "quarterly sales"),
    ("demo-bob", "customer churn"),
    ("demo-flaky", "server costs"),
    ("demo-carol", "hiring plan"),
    ("demo-broke", "marketing spend"),
    ("demo-dave", "support tickets"),
    ("demo-flaky", "uptime"),
    ("demo-erin", "inventory"),
]


class Command(BaseCommand):
    help = "Submit demo report tasks (idempotent: running it twice submits nothing new)."

    def add_arguments(self, parser):
        parser.add_argument("--prefix", default="demo", help="idempotency key prefix")

    def handle(self, *args, **options):
        ids = []
        for index, (user, topic) in enumerate(DEMO_REQUESTS):
            try:
                task = task_submit(
                    pipeline="report",
                    input={"user_id": user, "topic": topic},
                    idempotency_key=f"{options['prefix']}-{index}",
                )
            except ReliabilityError as exc:
                raise CommandError(f"could not submit demo task {index}: {exc}") from None
            ids.append(str(task.pk))
        self.stdout.write("\n".join(ids))
