"""The console's periodic work, run by the engine's sweeper as chores (registered in ``DlqConfig.ready``).

- ``bulk_redelivered``: bulk operations whose RQ job was lost are delivered again;
- ``dlq_items_purged``: resolved dead letters past ``RELIABILITY_DLQ_RETENTION_DAYS`` are deleted;
- ``alerts_evaluated``: the alert rules, every ``RELIABILITY_ALERT_INTERVAL_SECONDS`` (several
  sweepers evaluating at once is safe);
- ``audit_entries_purged``: audit entries past ``RELIABILITY_AUDIT_RETENTION_DAYS`` are deleted (and the
  deletion audited), every ``RELIABILITY_PURGE_INTERVAL_SECONDS``, a few seconds at most per run.
"""

from __future__ import annotations

from dlq.alerting.rules import alerts_evaluate
from dlq.audit import audit_entries_purge_due
from dlq.bulk import bulk_operations_redeliver_stale
from dlq.conf import console_settings
from tasks.conf import engine_settings
from tasks.lifecycle import dead_letters_purge_resolved
from tasks.registry import Chore, chore_register


def _evaluate_alerts() -> int:
    return len(alerts_evaluate().events)


def chores_register() -> None:
    chore_register(Chore("bulk_redelivered", bulk_operations_redeliver_stale))
    chore_register(Chore("dlq_items_purged", dead_letters_purge_resolved))
    chore_register(Chore("alerts_evaluated", _evaluate_alerts, interval=console_settings.ALERT_INTERVAL_SECONDS))
    chore_register(
        Chore("audit_entries_purged", audit_entries_purge_due, interval=engine_settings.PURGE_INTERVAL_SECONDS)
    )
