"""Read and validate settings from the environment.

Every tunable of the project is parsed here, once, so that a typo in a
deployment fails at start-up with one clear ``ImproperlyConfigured`` line
instead of surfacing as a strange runtime error hours later.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

from reliability_console.sentinel import SentinelConnection, SentinelSSLConnection
from tasks import setting_rules

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


class Env:
    """Typed accessors over an environment mapping."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ

    def str(self, name: str, default: str = "") -> str:
        return self.environ.get(name, default).strip()

    def bool(self, name: str, default: bool = False) -> bool:
        raw = self.environ.get(name)
        if raw is None:
            return default
        word = raw.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")

    def number(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        integer: bool = False,
    ) -> float:
        raw = self.environ.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            value: float = int(raw) if integer else float(raw)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise ImproperlyConfigured(f"{name}={raw!r} is not {kind}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ImproperlyConfigured(f"{name}={raw!r} must be at most {maximum}")
        return value

    def integer(self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        return int(self.number(name, default, minimum=minimum, maximum=maximum, integer=True))

    def list(self, name: str, default: list[str]) -> list[str]:
        raw = self.environ.get(name)
        if raw is None:
            return list(default)
        return [part.strip() for part in raw.split(",") if part.strip()]


# The values RELIABILITY_LOG_FORMAT takes: key=value text (the default) or JSON lines (reliability_console.logging).
LOG_FORMATS = ("text", "json")

# How processes reach PostgreSQL: each connection its own server session, or a transaction pooler between.
DATABASE_POOLERS = ("none", "transaction")


def validate_database_pooler(value: str) -> str:
    value = value.lower() or "none"
    if value == "session":  # a session pooler keeps one server session per client: as direct
        value = "none"
    if value not in DATABASE_POOLERS:
        raise ImproperlyConfigured(f"DATABASE_POOLER={value!r} must be one of none, session, transaction")
    return value


def database_config(url: str, var_dir: Path, *, pooler: str = "none") -> dict:
    """Return a Django DATABASES entry for ``url`` (or the local SQLite file when empty).

    Behind a transaction pooler no session state may outlive a transaction:
    Django's server-side cursors (``QuerySet.iterator()``) are off.
    """
    if not url:
        return sqlite_config(var_dir / "reliability.sqlite3")
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql", "pgsql"):
        if not parsed.path.strip("/"):
            raise ImproperlyConfigured(f"DATABASE_URL {redact_url(url)!r} names no database")
        import dj_database_url

        config = dj_database_url.parse(url, conn_max_age=600, conn_health_checks=True)
        if pooler == "transaction":
            config["DISABLE_SERVER_SIDE_CURSORS"] = True
        return config
    if parsed.scheme == "sqlite":
        path = parsed.path if parsed.netloc == "" else parsed.netloc + parsed.path
        if not path or path == "/":
            raise ImproperlyConfigured("DATABASE_URL sqlite:// needs a file path, e.g. sqlite:///var/db.sqlite3")
        return sqlite_config(Path(path.lstrip("/") if path.startswith("//") else path))
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgresql:// or sqlite:///path)"
    )


def sqlite_config(path: Path) -> dict:
    # Workers, the sweeper and the web server write concurrently. WAL lets
    # readers proceed during a write, IMMEDIATE takes the write lock at BEGIN
    # (so two writers queue instead of deadlocking on lock upgrade), and the
    # busy timeout makes the waiting writer block rather than fail at once.
    path.parent.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
        },
    }


def validate_redis_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"REDIS_URL {redact_url(url)!r} must start with redis://, rediss:// or unix://")
    return url


def redis_connection_config(
    url: str, *, sentinels: list[str], master: str, sentinel_password: str = "", socket_timeout: float = 5
) -> dict:
    """The connection part of a django-rq queue: ``url`` itself, or the primary that Sentinel names.

    With sentinels, ``url`` gives only the database number and password of
    the primary (its host is whatever Sentinel says now, after every
    failover); every Redis client of the project connects through django-rq,
    so this one entry configures them all.
    """
    if not sentinels:
        return {"URL": url}
    if not master:
        raise ImproperlyConfigured("REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER (the monitored name) is not")
    addresses = []
    for entry in sentinels:
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(f"REDIS_SENTINELS entry {entry!r} is not host:port")
        addresses.append((host.strip("[]"), int(port)))
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        raise ImproperlyConfigured("REDIS_SENTINELS cannot be used with a unix:// REDIS_URL")
    database = parsed.path.strip("/") or "0"
    if not database.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL {redact_url(url)!r}: the database must be a number")
    config = {
        "SENTINELS": addresses,
        "MASTER_NAME": master,
        "DB": int(database),
        "PASSWORD": parsed.password,
        "USERNAME": parsed.username or None,
        "SOCKET_TIMEOUT": socket_timeout,
        # A dead primary must fail fast so that the client asks Sentinel again; an interrupted
        # read (SIGTERM during an idle worker's BLPOP) must close the connection (sentinel.py).
        "CONNECTION_KWARGS": {
            "socket_connect_timeout": 2,
            "connection_class": SentinelSSLConnection if parsed.scheme == "rediss" else SentinelConnection,
        },
        "SENTINEL_KWARGS": {"socket_timeout": 2, "socket_connect_timeout": 2},
    }
    if sentinel_password:
        config["SENTINEL_KWARGS"]["password"] = sentinel_password
    return config


# The engine's rules judge a value (tasks.setting_rules, also used by its system checks); here they refuse one
# at start-up.
def _refused(problem: str | None) -> None:
    if problem:
        raise ImproperlyConfigured(problem)


def validate_http_url(name: str, url: str) -> str:
    _refused(setting_rules.http_url(name, url))
    return url.rstrip("/")


def validate_trace_url(name: str, url: str) -> str:
    """A trace link template (``{trace_id}`` in an http(s) URL), or empty for none."""
    _refused(setting_rules.trace_url(name, url))
    return url


def validate_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``."""
    _refused(setting_rules.Choice(choices)(name, value))
    return value


def validate_callback_hosts(name: str, values: list[str]) -> list[str]:
    """Allowed outbound hosts (callbacks, alert channels), lower-cased: ``host`` (any port) or ``host:port``;
    anything else is refused."""
    hosts = []
    for value in values:
        _refused(setting_rules.host_problem(name, value))
        hosts.append(value.lower())
    return hosts


def redact_url(url: str) -> str:
    """Hide the password of a URL so it can be logged."""
    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return parsed._replace(netloc=netloc).geturl()
    return url


def validate_regex(name: str, pattern: str) -> str:
    """``pattern`` if it compiles and cannot match an empty string (which would match everywhere)."""
    _refused(setting_rules.regex_problem(name, pattern))
    return pattern


def validate_regex_list(name: str, raw: str) -> list[str]:
    """A JSON array of regular expressions (empty text: none), each checked by ``validate_regex``."""
    if not raw.strip():
        return []
    try:
        patterns = json.loads(raw)
    except ValueError:
        patterns = None
    if not isinstance(patterns, list) or not all(isinstance(pattern, str) for pattern in patterns):
        example = r'["\\bacme_[0-9a-f]{32}\\b"]'
        raise ImproperlyConfigured(f"{name} must be a JSON array of regular expressions, e.g. {example}")
    return [validate_regex(f"{name}[{index}]", pattern) for index, pattern in enumerate(patterns)]


def validate_networks(name: str, values: list[str]) -> list:
    """Parse CIDRs (``10.0.0.0/8``, ``127.0.0.1``) or fail with the offending entry."""
    import ipaddress

    networks = []
    for value in values:
        _refused(setting_rules.network_problem(name, value))
        networks.append(ipaddress.ip_network(value, strict=False))
    return networks


def validate_directory(name: str, path: str) -> str:
    """Create ``path`` if needed and make sure this process can write there."""
    if not path:
        return ""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}={path!r}: cannot create the directory: {exc}") from None
    if not os.access(directory, os.W_OK):
        raise ImproperlyConfigured(f"{name}={path!r} is not writable")
    return str(directory)


def proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """``"X-Forwarded-Proto: https"`` as Django's ``SECURE_PROXY_SSL_HEADER``; empty is ``None``."""
    if not raw:
        return None
    name, separator, value = raw.partition(":")
    name, value = name.strip(), value.strip()
    if not separator or not name or not value or not all(c.isalnum() or c == "-" for c in name):
        raise ImproperlyConfigured(
            f"DJANGO_SECURE_PROXY_SSL_HEADER={raw!r} is not '<Header-Name>: <value>' (e.g. 'X-Forwarded-Proto: https')"
        )
    return "HTTP_" + name.upper().replace("-", "_"), value
