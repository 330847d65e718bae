"""deploy/: the Prometheus alert rules pass promtool, and the Grafana dashboard uses only exported metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "reliability-console.json"
METRIC_SOURCES = [
    ROOT / "tasks" / "observability" / "metrics.py",
    ROOT / "dlq" / "metrics.py",
    ROOT / "dlq" / "metrics_export.py",
]
METRIC_NAME = re.compile(r"\breliability_[a-z_]+\b")


def exported_metric_names() -> set[str]:
    """Every sample name the app exposes, read from where the metrics are declared."""
    names: set[str] = set()
    declaration = re.compile(r'(Counter|Histogram|CounterMetricFamily|GaugeMetricFamily)\(\s*"(reliability_\w+)"')
    for source in METRIC_SOURCES:
        for kind, name in declaration.findall(source.read_text()):
            if kind in ("Counter", "CounterMetricFamily"):
                names.add(f"{name}_total")
            elif kind == "Histogram":
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
            else:
                names.add(name)
    return names


def test_the_declared_metrics_are_found():
    names = exported_metric_names()
    assert {"reliability_dlq_open_items", "reliability_step_attempts_total", "reliability_workers"} <= names
    assert "reliability_task_duration_seconds_bucket" in names


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is missing: install Debian's `prometheus` package (apt-get install prometheus)",
)
def test_promtool_accepts_the_alert_rules():
    result = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_rules_use_only_exported_metrics():
    used = set(METRIC_NAME.findall(ALERTS.read_text()))
    assert used and used <= exported_metric_names(), used - exported_metric_names()


def test_the_grafana_dashboard_is_sane():
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    assert panels and len({panel["id"] for panel in panels}) == len(panels)
    exported = exported_metric_names()
    for panel in panels:
        assert panel["type"] in {"stat", "timeseries", "table", "gauge", "bargauge"}, panel["title"]
        assert panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("h", "w", "x", "y"))
        assert grid["x"] + grid["w"] <= 24
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(METRIC_NAME.findall(target["expr"]))
            assert used, (panel["title"], target["expr"])
            assert used <= exported, (panel["title"], used - exported)
    for variable in dashboard["templating"]["list"]:
        assert set(METRIC_NAME.findall(json.dumps(variable))) <= exported
