"""What a valid value of an engine or console setting is: each rule names the problem in one line, or None.

The system checks (``tasks.checks``, ``dlq.checks``) judge Django settings with these rules, and the
standalone project's environment parsing (``reliability_console.config``) uses the same ones, so a value is
judged alike wherever it comes from.
"""

from __future__ import annotations

import ipaddress
import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

# A rule: (setting name, value) -> the problem as one line, or None when the value is fine.
Rule = Callable[[str, Any], "str | None"]

# A host name or IP address (no scheme, path or credentials), optionally with a port.
HOST_ENTRY = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?$")


@dataclass(frozen=True)
class Number:
    """A finite number (an ``int`` when ``integer``) within the bounds; a bool is not a number here."""

    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False

    def __call__(self, name: str, value: Any) -> str | None:
        kinds = (int,) if self.integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"{name}={value!r} is not {'an integer' if self.integer else 'a number'}"
        if not math.isfinite(value):
            return f"{name}={value!r} is not a finite number"
        if self.minimum is not None and value < self.minimum:
            return f"{name}={value!r} must be at least {self.minimum}"
        if self.maximum is not None and value > self.maximum:
            return f"{name}={value!r} must be at most {self.maximum}"
        return None


def boolean(name: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{name} must be True or False, not {value!r}"


def text(name: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{name}={value!r} is not a string"


# The levels of the logging module, by name (a log level setting is one of them).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of strings."""

    choices: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> str | None:
        if value not in self.choices:
            return f"{name}={value!r} is not one of {', '.join(self.choices)}"
        return None


log_level = Choice(LOG_LEVELS)


def names(name: str, value: Any) -> str | None:
    """A list or tuple of non-empty strings (module paths, queue names)."""
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) and item for item in value):
        return f"{name}={value!r} is not a list of names"
    return None


def mapping(name: str, value: Any) -> str | None:
    return None if isinstance(value, dict) else f"{name}={value!r} is not a dict"


def regex_problem(name: str, pattern: Any) -> str | None:
    """A pattern that compiles and cannot match an empty string (which would match everywhere)."""
    if not isinstance(pattern, str):
        return f"{name}={pattern!r} is not a string"
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return f"{name}: {pattern!r} is not a regular expression: {exc}"
    if regex.search(""):
        return f"{name}: {pattern!r} matches the empty string, so it would match everything"
    return None


def regex_list(name: str, value: Any) -> str | None:
    if not isinstance(value, list | tuple):
        return f"{name}={value!r} is not a list of regular expressions"
    for index, pattern in enumerate(value):
        problem = regex_problem(f"{name}[{index}]", pattern)
        if problem:
            return problem
    return None


def host_problem(name: str, value: Any) -> str | None:
    """An outbound allow-list entry: ``host`` (any port) or ``host:port``."""
    match = HOST_ENTRY.fullmatch(value) if isinstance(value, str) else None
    if match is None or (match.group(2) and not 0 < int(match.group(2)[1:]) < 65536):
        return f"{name}: {value!r} is not a host or host:port (e.g. hooks.example.com:443)"
    return None


def hosts(name: str, value: Any) -> str | None:
    if not isinstance(value, list | tuple):
        return f"{name}={value!r} is not a list of hosts"
    return next((problem for entry in value if (problem := host_problem(name, entry))), None)


def http_url(name: str, value: Any) -> str | None:
    parsed = urlparse(value) if isinstance(value, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"{name}={value!r} must be an http:// or https:// URL"
    return None


def trace_url(name: str, value: Any) -> str | None:
    """A link to a trace in a tracing UI: empty (no link), or an http(s) URL with ``{trace_id}`` and no other
    placeholder (``http://jaeger:16686/trace/{trace_id}``; a literal brace doubled, as ``str.format`` reads it)."""
    if value == "":
        return None
    example = "e.g. http://jaeger:16686/trace/{trace_id}"
    if not isinstance(value, str):
        return f"{name}={value!r} is not a string"
    try:
        fields = [(field, spec, conversion) for _, field, spec, conversion in string.Formatter().parse(value) if field]
    except ValueError as exc:
        return f"{name}={value!r} is not a URL template ({exc}): {example}"
    if fields != [("trace_id", "", None)]:
        return f"{name}={value!r} must hold {{trace_id}} once and no other placeholder: {example}"
    return http_url(name, value.format(trace_id="0" * 32))


def network_problem(name: str, value: Any) -> str | None:
    """An IP network (``ipaddress`` object, or text in CIDR form such as ``10.0.0.0/8``)."""
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return None
    try:
        ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        return f"{name}: {value!r} is not an IP network (use CIDR, e.g. 10.0.0.0/8)"
    return None


def networks(name: str, value: Any) -> str | None:
    if not isinstance(value, list | tuple):
        return f"{name}={value!r} is not a list of IP networks"
    return next((problem for entry in value if (problem := network_problem(name, entry))), None)
