"""What the retention purges did last: one row per kind of data purged, for the dashboard."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RetentionPurge(models.Model):
    """The latest purge of one kind of old data (the engine's finished tasks, the console's audit entries).

    Every run updates ``checked_at``; a run that deleted something also
    replaces the ``last_*`` figures and adds to the totals. The runs
    themselves are logged (``event=tasks_purged``, ``event=audit_entries_purged``).
    """

    kind = models.CharField(max_length=50, unique=True)
    checked_at = models.DateTimeField(help_text=_("the last run, whether or not it found anything to delete"))
    last_purged_at = models.DateTimeField(null=True, blank=True, help_text=_("the end of the last run that deleted"))
    last_cutoff = models.DateTimeField(null=True, blank=True, help_text=_("that run deleted data older than this"))
    last_items = models.PositiveBigIntegerField(default=0, help_text=_("tasks or audit entries that run deleted"))
    last_rows = models.PositiveBigIntegerField(default=0, help_text=_("every row that run deleted, children included"))
    last_seconds = models.FloatField(default=0)
    caught_up = models.BooleanField(
        default=True, help_text=_("false: the last run stopped at its time limit with more to delete")
    )
    total_items = models.PositiveBigIntegerField(default=0)
    total_rows = models.PositiveBigIntegerField(default=0)

    class Meta:
        verbose_name = _("retention purge")
        verbose_name_plural = _("retention purges")

    def __str__(self) -> str:
        return f"{self.kind}: {self.last_items} at {self.last_purged_at}"
