"""python manage.py run_sweeper [--once] [--interval S]: deliver what Redis lost, re-queue expired leases."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from tasks.conf import engine_settings
from tasks.delivery.sweeper import sweep_once, sweeper_heartbeat, sweeper_loop, sweeper_name


class Command(BaseCommand):
    help = "Run the sweeper loop (safe to run several at once)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="sweep once and exit")
        parser.add_argument("--interval", type=float, default=None, help="seconds between sweeps")

    def handle(self, *args, **options):
        interval = options["interval"] or engine_settings.SWEEP_INTERVAL_SECONDS
        if interval <= 0:
            raise CommandError("--interval must be positive")
        if options["once"]:
            report = sweep_once()
            sweeper_heartbeat(name=sweeper_name())
            self.stdout.write(str(report.as_log()))
            return
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        sweeper_loop(interval=interval, stop=stop)
