"""The console's settings, each with its default and its rule, read lazily from Django's settings.

As ``tasks.conf`` for the engine: ``console_settings.BULK_CANARY_SIZE`` reads
``settings.RELIABILITY_BULK_CANARY_SIZE`` on every access and falls back to the default below;
``dlq.checks`` judges each set value with its rule. The engine's settings the console also reads
(the sweep interval, the retention days) stay the engine's: ``tasks.conf.engine_settings``.
"""

from __future__ import annotations

from tasks import setting_rules as rules
from tasks.conf import PREFIX, AppSettings, Setting

number = rules.Number
CONSOLE_SETTINGS: dict[str, Setting] = {
    key: Setting(PREFIX + key, *entry)
    for key, entry in {
        "BULK_APPROVAL_THRESHOLD": (
            100,
            "bulk actions over this many items need a second supervisor",
            number(minimum=1, integer=True),
        ),
        "BULK_CANARY_SIZE": (10, "items in a bulk action's canary batch", number(minimum=1, integer=True)),
        "BULK_CANARY_MAX_FAILURE_RATE": (
            0.2,
            "a canary failing more than this stops the bulk action",
            number(minimum=0, maximum=1),
        ),
        "BULK_RATE_PER_SECOND": (5, "pace of a bulk action after its canary", number(minimum=0.01)),
        "AUDIT_RETENTION_DAYS": (0, "days audit entries are kept (0: forever)", number(minimum=0, integer=True)),
        "ALERT_INTERVAL_SECONDS": (60, "how often the sweeper evaluates alert rules", number(minimum=1)),
        "ALERT_ALLOWED_HOSTS": ([], "hosts alert channels may send to (empty: any public host)", rules.hosts),
        "CONSOLE_URL": ("http://127.0.0.1:8000", "the console's public URL, for notification links", rules.http_url),
        "TRACE_URL": (
            "",
            "the link to a task's trace in a tracing UI, {trace_id} replaced (empty: no link)",
            rules.trace_url,
        ),
        "METRICS_TOKEN": ("", "bearer token a scraper must send to /metrics", rules.text),
        "METRICS_ALLOWED_NETWORKS": ([], "networks allowed to scrape /metrics", rules.networks),
    }.items()
}
CONSOLE_SETTINGS["PROMETHEUS_MULTIPROC_DIR"] = Setting(
    "PROMETHEUS_MULTIPROC_DIR", "", "prometheus-client's multiprocess directory (empty: off)", rules.text
)

console_settings = AppSettings(CONSOLE_SETTINGS)
