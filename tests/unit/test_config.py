import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from reliability_console.config import (
    Env,
    database_config,
    redact_url,
    redis_connection_config,
    validate_callback_hosts,
    validate_database_pooler,
    validate_http_url,
    validate_redis_url,
    validate_regex_list,
)
from reliability_console.sentinel import SentinelConnection, SentinelSSLConnection

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize(
    ("raw", "message"),
    [("abc", "not a number"), ("nan", "finite"), ("-1", "at least"), ("inf", "finite")],
)
def test_numbers_are_validated(raw, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        Env({"X": raw}).number("X", 1, minimum=0)


def test_integers_and_booleans():
    env = Env({"N": "3", "B": "yes", "BAD": "maybe"})
    assert env.integer("N", 1) == 3 and env.bool("B") is True
    with pytest.raises(ImproperlyConfigured):
        env.bool("BAD")
    with pytest.raises(ImproperlyConfigured):
        Env({"N": "3.5"}).integer("N", 1)


def test_database_urls(tmp_path):
    assert database_config("", tmp_path)["ENGINE"] == "django.db.backends.sqlite3"
    sqlite = database_config("", tmp_path)["OPTIONS"]
    assert sqlite["transaction_mode"] == "IMMEDIATE" and "journal_mode=WAL" in sqlite["init_command"]
    pg = database_config("postgresql://u:p@db:5432/app", tmp_path)
    assert (pg["ENGINE"], pg["NAME"], pg["HOST"]) == ("django.db.backends.postgresql", "app", "db")
    with pytest.raises(ImproperlyConfigured, match="not supported"):
        database_config("mysql://x/y", tmp_path)
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        database_config("postgresql://u@db:5432/", tmp_path)


def test_a_transaction_pooler_turns_off_server_side_cursors(tmp_path):
    url = "postgresql://u@pgbouncer:6432/app"
    assert database_config(url, tmp_path).get("DISABLE_SERVER_SIDE_CURSORS", False) is False
    assert database_config(url, tmp_path, pooler="transaction")["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert [validate_database_pooler(value) for value in ("", "none", "Session", "TRANSACTION")] == [
        "none",
        "none",
        "none",
        "transaction",
    ]
    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOLER='statement' must be one of"):
        validate_database_pooler("statement")


def test_redis_through_sentinel():
    assert redis_connection_config("redis://h:6379/2", sentinels=[], master="") == {"URL": "redis://h:6379/2"}
    config = redis_connection_config(
        "redis://:pw@ignored:6379/3", sentinels=["10.0.0.1:26379", "[::1]:26380"], master="rc", sentinel_password="sp"
    )
    assert config["SENTINELS"] == [("10.0.0.1", 26379), ("::1", 26380)]
    assert (config["MASTER_NAME"], config["DB"], config["PASSWORD"]) == ("rc", 3, "pw")
    assert config["SENTINEL_KWARGS"]["password"] == "sp"
    assert config["CONNECTION_KWARGS"]["connection_class"] is SentinelConnection
    secure = redis_connection_config("rediss://h:6379/0", sentinels=["h:26379"], master="rc")
    assert secure["CONNECTION_KWARGS"]["connection_class"] is SentinelSSLConnection
    with pytest.raises(ImproperlyConfigured, match="REDIS_SENTINEL_MASTER"):
        redis_connection_config("redis://h/0", sentinels=["h:26379"], master="")
    with pytest.raises(ImproperlyConfigured, match="'h' is not host:port"):
        redis_connection_config("redis://h/0", sentinels=["h"], master="rc")
    with pytest.raises(ImproperlyConfigured, match="is not host:port"):
        redis_connection_config("redis://h/0", sentinels=["h:99999"], master="rc")


def test_url_validation_and_redaction():
    assert validate_redis_url("redis://localhost:6379/0")
    with pytest.raises(ImproperlyConfigured):
        validate_redis_url("http://localhost")
    with pytest.raises(ImproperlyConfigured):
        validate_http_url("REPORT_PLATFORM_URL", "ftp://x")
    assert redact_url("postgresql://u:hunter2@h/db") == "postgresql://u:***@h/db"


def manage_py_check_error(name: str, raw: str) -> str:
    """What ``manage.py check`` says on stderr when setting ``name`` is ``raw`` (it must stop with status 2)."""
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SECRET_KEY": "x", name: raw}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    return result.stderr.strip()


@pytest.mark.processes
def test_a_bad_setting_stops_manage_py_with_one_readable_line():
    assert manage_py_check_error("RELIABILITY_LEASE_SECONDS", "soon") == (
        "configuration error: RELIABILITY_LEASE_SECONDS='soon' is not a number"
    )


@pytest.mark.processes
@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("RELIABILITY_LOG_FORMAT", "xml", "'xml' is not one of text, json"),
        ("RELIABILITY_ATTEMPT_LOG_LEVEL", "loud", "'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("RELIABILITY_ATTEMPT_LOG_BYTES", "10", "'10' must be at least 1024"),
    ],
)
def test_a_bad_log_setting_stops_manage_py_with_one_readable_line(name, raw, message):
    assert manage_py_check_error(name, raw) == f"configuration error: {name}={message}"


@pytest.mark.processes
@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("RELIABILITY_TASK_RETENTION_DAYS", "-1", "must be at least 0"),
        ("RELIABILITY_TASK_RETENTION_DAYS", "a month", "is not an integer"),
        ("RELIABILITY_AUDIT_RETENTION_DAYS", "7.5", "is not an integer"),
        ("RELIABILITY_PURGE_BATCH_SIZE", "0", "must be at least 1"),
        ("RELIABILITY_PURGE_BATCH_SIZE", "100000", "must be at most 10000"),
        ("RELIABILITY_PURGE_INTERVAL_SECONDS", "0", "must be at least 1"),
    ],
)
def test_a_bad_retention_setting_stops_manage_py_with_one_readable_line(name, raw, message):
    assert manage_py_check_error(name, raw) == f"configuration error: {name}={raw!r} {message}"


@pytest.mark.processes
@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (
            "RELIABILITY_REDACT_PATTERNS",
            '["ok_[0-9]{4}", "(unclosed"]',
            "RELIABILITY_REDACT_PATTERNS[1]: '(unclosed' is not a regular expression: "
            "missing ), unterminated subpattern at position 0",
        ),
        (
            "RELIABILITY_REDACT_PATTERNS",
            '["x*"]',
            "RELIABILITY_REDACT_PATTERNS[0]: 'x*' matches the empty string, so it would match everything",
        ),
        (
            "RELIABILITY_REDACT_PATTERNS",
            "acme_[0-9a-f]{32}",
            "RELIABILITY_REDACT_PATTERNS must be a JSON array of regular expressions, "
            r'e.g. ["\\bacme_[0-9a-f]{32}\\b"]',
        ),
        (
            "RELIABILITY_REDACT_PATTERN",
            "password|",
            "RELIABILITY_REDACT_PATTERN: 'password|' matches the empty string, so it would match everything",
        ),
    ],
)
def test_a_bad_redaction_rule_stops_manage_py_with_one_readable_line(name, raw, message):
    assert manage_py_check_error(name, raw) == f"configuration error: {message}"


def test_redaction_rules_from_the_environment():
    assert validate_regex_list("R", "") == []
    assert validate_regex_list("R", r'["\\bacme_[0-9a-f]{8}\\b", "(?i)pin (?P<secret>\\d{4})"]') == [
        r"\bacme_[0-9a-f]{8}\b",
        r"(?i)pin (?P<secret>\d{4})",
    ]
    for raw in ("[1]", '{"a": "b"}', "[unquoted]"):
        with pytest.raises(ImproperlyConfigured, match="must be a JSON array of regular expressions"):
            validate_regex_list("R", raw)


def test_callback_hosts_are_hosts_or_host_ports():
    entries = ["Hooks.Example.com", "10.0.0.7:8443", "[::1]:9000", "receiver"]
    assert validate_callback_hosts("H", entries) == ["hooks.example.com", "10.0.0.7:8443", "[::1]:9000", "receiver"]
    assert validate_callback_hosts("H", Env({"H": ""}).list("H", [])) == []  # empty: callbacks off
    for bad in ("https://hooks.example.com", "hooks.example.com/path", "user@host", "host:0", "host:70000", "*.x.com"):
        with pytest.raises(ImproperlyConfigured, match="is not a host or host:port"):
            validate_callback_hosts("H", [bad])
