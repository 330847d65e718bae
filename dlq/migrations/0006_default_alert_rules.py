"""Sane default alert rules and a log channel, so a fresh install alerts out of the box."""

from django.db import migrations

DEFAULT_RULES = [
    # name, kind, threshold, window_seconds, lookback_days
    ("DLQ: more than 50 open items", "open_items", 50, 3600, 7),
    ("DLQ: more than 10 new items in 10 minutes", "growth", 10, 600, 7),
    ("DLQ: oldest open item older than a day", "oldest_age", 86400, 3600, 7),
    ("DLQ: new failure group (not seen in 7 days)", "new_failure_group", 0, 3600, 7),
    ("Sweeper has not run for 2 minutes", "sweeper_stalled", 120, 3600, 7),
]


def forwards(apps, schema_editor):
    AlertChannel = apps.get_model("dlq", "AlertChannel")
    AlertRule = apps.get_model("dlq", "AlertRule")
    AlertChannel.objects.get_or_create(name="log", defaults={"kind": "log"})
    for name, kind, threshold, window, lookback in DEFAULT_RULES:
        AlertRule.objects.get_or_create(
            name=name,
            defaults={"kind": kind, "threshold": threshold, "window_seconds": window, "lookback_days": lookback},
        )


def backwards(apps, schema_editor):
    apps.get_model("dlq", "AlertRule").objects.filter(name__in=[rule[0] for rule in DEFAULT_RULES]).delete()
    apps.get_model("dlq", "AlertChannel").objects.filter(name="log", kind="log").delete()


class Migration(migrations.Migration):
    dependencies = [("dlq", "0005_alerting")]

    operations = [migrations.RunPython(forwards, backwards)]
