"""python manage.py evaluate_alerts [--once] [--interval S]: evaluate the alert rules (safe to run several)."""

from __future__ import annotations

import logging
import signal
import threading

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from dlq.alerting.rules import alerts_evaluate
from dlq.conf import console_settings

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Evaluate alert rules now (--once) or every RELIABILITY_ALERT_INTERVAL_SECONDS."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="evaluate once and exit")
        parser.add_argument("--interval", type=float, default=None, help="seconds between evaluations")

    def handle(self, *args, **options):
        interval = options["interval"] or console_settings.ALERT_INTERVAL_SECONDS
        if interval <= 0:
            raise CommandError("--interval must be positive")
        if options["once"]:
            self._report(alerts_evaluate())
            return
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.is_set():
            try:
                self._report(alerts_evaluate())
            except Exception:
                # A database outage must not end the loop: evaluate again next round.
                logger.exception("alert evaluation failed", extra={"event": "alert_evaluation_failed"})
            finally:
                close_old_connections()
            stop.wait(interval)

    def _report(self, report) -> None:
        self.stdout.write(f"evaluated {report.evaluated} rules, {len(report.events)} events")
        for event in report.events:
            self.stdout.write(f"  {event.rule.name}: {event.kind} (value {event.value})")
        for error in report.errors:
            self.stderr.write(f"  error: {error}")
