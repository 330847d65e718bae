"""Signals sent to a task (``Pipeline.wait``): one per task and name, kept until the task is purged.

A signal sent before the task reaches its wait is kept and consumed there; the same signal again with the same
payload is the first one (its answer replayed), with another payload a conflict.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from tasks.models.door import DoorManager


class Signal(models.Model):
    """A named signal a task's wait step waits for, with its payload (JSON); its checkpoint once consumed."""

    # Looked up through the unique (task, name) index.
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="signals", db_index=False)
    name = models.CharField(max_length=100)
    payload = models.JSONField(null=True, blank=True)
    # sha256 of the payload's canonical JSON: what tells a repeat from a conflicting second signal.
    payload_fingerprint = models.CharField(max_length=64)
    # The Idempotency-Key the sender gave, if any: the same key for another signal of the task is refused.
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    # Who sent it: "client:<name>", "operator:<username>", "python".
    sent_by = models.CharField(max_length=200, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("signal")
        verbose_name_plural = _("signals")
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="signal_unique_name")]

    def __str__(self) -> str:
        return f"{self.task_id} signal {self.name}"
