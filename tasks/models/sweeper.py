"""Sweeper processes and when each last completed a sweep."""

from __future__ import annotations

from django.db import models


class SweeperHeartbeat(models.Model):
    """One row per sweeper process: when it last completed a sweep (for the dashboard and alerts)."""

    name = models.CharField(max_length=200, unique=True)
    last_run_at = models.DateTimeField()
    runs = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} at {self.last_run_at}"
