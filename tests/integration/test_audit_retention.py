"""The audit log's retention: old entries go, the purge audits itself, and every other change is still refused."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from dlq.audit import AUDIT_PURGE_KIND, audit_entries_purge, audit_entries_purge_due
from dlq.audit_actions import AUDIT_PURGE_ACTION
from dlq.models import AuditEntry
from tasks import registry
from tasks.models import RetentionPurge
from tests.support import aged_audit_entry, manage, process_env

pytestmark = pytest.mark.django_db(transaction=True)

RETENTION = timedelta(days=90)


def test_old_entries_go_and_the_purge_writes_its_own_entry():
    old = [aged_audit_entry(age=timedelta(days=100)) for _ in range(3)]
    recent = aged_audit_entry(age=timedelta(days=80))

    report = audit_entries_purge(older_than=RETENTION, batch_size=2)

    assert (report.entries, report.batches, report.complete) == (3, 2, True)
    assert not AuditEntry.objects.filter(pk__in=[e.pk for e in old]).exists()
    assert AuditEntry.objects.filter(pk=recent.pk).exists()
    # One entry per transaction: each names how many it deleted and the cutoff.
    purges = list(AuditEntry.objects.filter(action=AUDIT_PURGE_ACTION).order_by("pk"))
    cutoff = report.cutoff.isoformat()
    # Stored as a code with its facts, worded for each reader; the English sentence kept for the column's readers.
    assert [(p.detail_code, p.detail_params) for p in purges] == [
        ("audit_purged", {"count": 2, "cutoff": cutoff, "days": "90"}),
        ("audit_purged", {"count": 1, "cutoff": cutoff, "days": "90"}),
    ]
    assert [p.detail for p in purges] == [
        f"2 entries created before {cutoff} deleted (older than 90 days)",
        f"1 entry created before {cutoff} deleted (older than 90 days)",
    ]
    assert all(p.target_id == cutoff and p.reason == "" for p in purges)
    assert {p.actor for p in purges} == {"system:retention"} and {p.outcome for p in purges} == {"succeeded"}
    record = RetentionPurge.objects.get(kind=AUDIT_PURGE_KIND)
    assert (record.last_items, record.total_items) == (3, 3)


def test_a_dry_run_counts_and_changes_nothing():
    aged_audit_entry(age=timedelta(days=100)), aged_audit_entry(age=timedelta(days=1))
    report = audit_entries_purge(older_than=RETENTION, dry_run=True)
    assert report.entries == 1
    assert AuditEntry.objects.count() == 2 and not AuditEntry.objects.filter(action=AUDIT_PURGE_ACTION).exists()


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM dlq_auditentry",
        "UPDATE dlq_auditentry SET actor = 'mallory'",
        # The purge's permission covers entries before its cutoff, not a newer one.
        "SELECT set_config('reliability.audit_purge_before', (now() - interval '1 day')::text, true); "
        "DELETE FROM dlq_auditentry",
        # ... and no UPDATE at all.
        "SELECT set_config('reliability.audit_purge_before', now()::text, true); "
        "UPDATE dlq_auditentry SET actor = 'mallory'",
    ],
    ids=["delete", "update", "delete-newer-than-the-cutoff", "update-while-purging"],
)
def test_any_other_change_of_the_audit_log_is_still_rejected(statement):
    kept = aged_audit_entry(age=timedelta(hours=1))
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    assert AuditEntry.objects.get(pk=kept.pk).actor == "operator1"


def test_the_purge_permission_ends_with_its_transaction():
    old = aged_audit_entry(age=timedelta(days=100))
    audit_entries_purge(older_than=RETENTION, dry_run=False, batch_size=1, max_seconds=0)
    survivor = aged_audit_entry(age=timedelta(days=100))
    assert not AuditEntry.objects.filter(pk=old.pk).exists()
    # Same connection, next transaction: the setting is gone, a plain DELETE is refused again.
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM dlq_auditentry WHERE id = %s", [survivor.pk])


def test_the_sweeper_keeps_audit_entries_forever_unless_a_retention_is_set(settings):
    chore = registry._CHORES["audit_entries_purged"]
    assert chore.run is audit_entries_purge_due
    assert chore.interval == settings.RELIABILITY_PURGE_INTERVAL_SECONDS
    old = aged_audit_entry(age=timedelta(days=400))
    assert settings.RELIABILITY_AUDIT_RETENTION_DAYS == 0
    assert audit_entries_purge_due() == 0 and AuditEntry.objects.filter(pk=old.pk).exists()
    settings.RELIABILITY_AUDIT_RETENTION_DAYS = 365
    assert audit_entries_purge_due() == 1 and not AuditEntry.objects.filter(pk=old.pk).exists()


def test_the_command_purges_and_reports(capsys):
    aged_audit_entry(age=timedelta(days=100))
    call_command("purge_audit_log", "--older-than", "90")
    assert "deleted 1 audit entries" in capsys.readouterr().out


@pytest.mark.processes
@pytest.mark.parametrize("arguments", [["--older-than", "-1"], ["--older-than", "ninety"], []])
def test_the_command_refuses_bad_input_with_one_line_and_a_non_zero_exit(arguments):
    result = subprocess.run(
        manage("purge_audit_log", *arguments), env=process_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), result.stderr
