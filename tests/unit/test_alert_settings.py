"""Settings and access rules of alerting and metrics, without services."""

from __future__ import annotations

import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured

from dlq.alerting.channels import body_bytes
from dlq.metrics_export import metrics_access
from reliability_console.config import validate_directory, validate_networks


def test_networks_are_parsed_and_a_bad_one_is_named():
    assert validate_networks("X", ["10.0.0.0/8", "127.0.0.1"]) == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
    ]
    with pytest.raises(ImproperlyConfigured, match=r"'10\.0\.0\.300/8'"):
        validate_networks("RELIABILITY_METRICS_ALLOWED_NETWORKS", ["10.0.0.300/8"])


def test_the_multiprocess_directory_is_created(tmp_path):
    target = tmp_path / "a" / "b"
    assert validate_directory("PROMETHEUS_MULTIPROC_DIR", str(target)) == str(target) and target.is_dir()
    assert validate_directory("PROMETHEUS_MULTIPROC_DIR", "") == ""


@pytest.mark.parametrize(
    ("token", "networks", "authorization", "address", "status"),
    [
        ("", [], "Bearer x", "127.0.0.1", 403),
        ("x", [], "", "127.0.0.1", 401),
        ("x", [], "Bearer y", "127.0.0.1", 401),
        ("x", [], "bearer x", "127.0.0.1", 200),
        ("", ["127.0.0.0/8"], "", "127.0.0.1", 200),
        ("", ["127.0.0.0/8"], "", "10.0.0.1", 403),
        ("", ["127.0.0.0/8"], "", "not-an-address", 403),
        ("x", ["127.0.0.0/8"], "", "127.0.0.1", 401),
        ("x", ["127.0.0.0/8"], "Bearer x", "10.0.0.1", 403),
    ],
)
def test_metrics_access(settings, token, networks, authorization, address, status):
    settings.RELIABILITY_METRICS_TOKEN = token
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network(n) for n in networks]
    assert metrics_access(authorization=authorization, remote_addr=address)[0] == status


def test_bodies_are_canonical():
    body = body_bytes({"b": 1, "a": "é"})
    assert body == '{"a":"é","b":1}'.encode() == body_bytes({"a": "é", "b": 1})
