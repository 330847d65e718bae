"""python manage.py run_sweeper [--once] [--interval S]: deliver what Redis lost, re-queue expired leases."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from dlq.alerting import EvaluationSchedule
from tasks.sweeper import sweep_once, sweeper_heartbeat

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the sweeper loop (safe to run several at once)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="sweep once and exit")
        parser.add_argument("--interval", type=float, default=None, help="seconds between sweeps")

    def handle(self, *args, **options):
        interval = options["interval"] or settings.RELIABILITY_SWEEP_INTERVAL_SECONDS
        if interval <= 0:
            raise CommandError("--interval must be positive")
        if options["once"]:
            report = sweep_once()
            sweeper_heartbeat(name=f"{socket.gethostname()}:{os.getpid()}")
            self.stdout.write(str(report.as_log()))
            return
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        logger.info("sweeper started", extra={"event": "sweeper_started", "interval": interval})
        name = f"{socket.gethostname()}:{os.getpid()}"
        # Alert rules are evaluated from this loop every RELIABILITY_ALERT_INTERVAL_SECONDS
        # (an in-memory check between sweeps); several sweepers evaluating is safe.
        alerts = EvaluationSchedule()
        while not stop.is_set():
            try:
                sweep_once()
                sweeper_heartbeat(name=name)
                alerts.run_if_due()
            except Exception:
                # A database or Redis outage must not end the loop: retry next round.
                logger.exception("sweep failed", extra={"event": "sweep_failed"})
            finally:
                close_old_connections()
            stop.wait(interval)
        logger.info("sweeper stopped", extra={"event": "sweeper_stopped"})
