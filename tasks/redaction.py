"""Redact secrets from what the engine stores and shows: error messages, tracebacks, outputs, snapshots.

Three things are redacted, wherever they appear:

- the values of secret-looking keys of a structure (``RELIABILITY_REDACT_PATTERN``
  matches the key's name), as before;
- secret-shaped text: the rules of ``REDACTION_RULES`` (bearer tokens, API keys
  of known services, credentials in URLs, ``password=…`` and
  ``'api_key': '…'`` pairs, …) plus the deployment's own
  (``RELIABILITY_REDACT_PATTERNS``): one list, compiled once per process;
- the values of the task's own secret input keys: with input
  ``{"password": "hunter2"}``, "hunter2" anywhere in that task's errors and
  outputs.

The engine's writers apply it when they store (``tasks.execution.attempts``,
``tasks.lifecycle.outcomes``, ``tasks.lifecycle.dead_letters``): nothing unredacted reaches the
database, so every reader (the API, the admin, the alerts) is safe.

Logs get the same treatment for URLs: ``query_strings_redacted`` takes the
credentials out of every query string in a log line (the project's log
formatter and gunicorn's access log use it), so a token sent as
``?token=…`` is refused and never written down.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote_plus

from tasks.conf import engine_settings

REDACTED = "[redacted]"
# Nested payloads deeper than this are cut rather than walked.
MAX_DEPTH = 32
# A secret input value shorter than this is not looked for in text: it would match by chance.
MIN_SECRET_LENGTH = 6
# No default rule matches fewer characters ("pwd=abc" is 7): shorter strings skip them.
MIN_RULE_MATCH_LENGTH = 7
# A rule whose regex has groups named secret… replaces only what those groups matched;
# without them, the whole match.
SECRET_GROUP_PREFIX = "secret"

# Names whose value follows a ":" or "=" in text (query strings, JSON, Python reprs, headers),
# alone or as the last part of a name: db_password, X-Api-Key, oauth_token.
_SECRET_NAMES = (
    r"password|passwd|passphrase|pwd|secret|secret[_-]?(?:access[_-]?)?key|client[_-]?secret|token|"
    r"api[_-]?key|apikey|access[_-]?key|private[_-]?key|auth|authorization|credentials?|cookie|"
    r"session[_-]?(?:id|key|token)|signature|card[_-]?(?:number|num|no)|cvv2?|cvc"
)
# Not "[redacted]" again (redacting twice changes nothing), nor an auth scheme with no credential after it.
_A_VALUE = r"(?!\[redacted\])(?!(?:bearer|basic|token|digest)\b[ \t]*(?:[<'\",;&)}\]\r\n]|$))"


@dataclass(frozen=True)
class DefaultRule:
    """A rule shipped with the engine; ``hints`` are lower-case strings one of which any match contains."""

    pattern: str
    hints: tuple[str, ...]


# The default rules; RELIABILITY_REDACT_PATTERNS adds to them. The hints only make them cheap:
# a text holding none of a rule's hints is not searched with it.
REDACTION_RULES: tuple[DefaultRule, ...] = (
    # name=value, name: value, 'name': 'value', "name": "value" (quoted values may hold spaces).
    DefaultRule(
        r"(?i)(?<![A-Za-z0-9])(?:" + _SECRET_NAMES + r")['\"]?[ \t]*[:=][ \t]*"
        r"(?:(?P<quote>['\"])" + _A_VALUE + r"(?P<secret>(?:\\.|(?!(?P=quote))[^\\\r\n])+)(?P=quote)"
        r"|" + _A_VALUE + r"(?P<secret_bare>(?:(?:bearer|basic|token|digest)[ \t]+)?[^\s'\",;&<>(){}\[\]]+))",
        ("pass", "pwd", "secret", "token", "key", "auth", "credential", "cookie", "session", "signature", "card", "cv"),
    ),
    # A bearer token anywhere ("Bearer" alone or before a placeholder is none: a token holds a digit or a symbol).
    DefaultRule(r"(?i)\bbearer[ \t]+(?P<secret>(?=[A-Za-z0-9._~+/-]*[0-9._~+/-])[A-Za-z0-9._~+/-]{8,}=*)", ("bearer",)),
    # user:password@ in a URL (any scheme): the password.
    DefaultRule(r"(?i)\b[a-z][a-z0-9+.-]{0,30}://[^\s/:@]*:(?P<secret>[^\s/@]+)@", ("://",)),
    # Stripe secret and restricted keys.
    DefaultRule(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}", ("_live_", "_test_")),
    # Webhook signing secrets: Stripe's (alphanumeric) and this engine's callback secrets (tasks.lifecycle.clients:
    # token_urlsafe, so "-" and "_" anywhere, even first: a rule stopping at them left the rest readable).
    DefaultRule(r"(?<![A-Za-z0-9])whsec_[A-Za-z0-9_-]{16,}", ("whsec_",)),
    # This engine's API tokens (tasks.lifecycle.clients: "rc_" and token_urlsafe(32), 43 characters). One without a
    # capital or a digit is a snake_case name that happens to be as long (1 in 10^15 for a real token).
    DefaultRule(r"(?<![A-Za-z0-9])rc_(?=[a-z_-]{0,42}[A-Z0-9])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])", ("rc_",)),
    # OpenAI, Anthropic and look-alike "sk-" keys.
    DefaultRule(r"\bsk-(?:[A-Za-z0-9]+-){0,3}[A-Za-z0-9_]{20,}", ("sk-",)),
    # GitHub tokens and fine-grained personal access tokens; GitLab; npm; Hugging Face.
    DefaultRule(r"\bgh[pousr]_[A-Za-z0-9]{30,}", ("gh",)),
    DefaultRule(r"\bgithub_pat_[A-Za-z0-9_]{30,}", ("github_pat_",)),
    DefaultRule(r"\bglpat-[A-Za-z0-9_-]{20,}", ("glpat-",)),
    DefaultRule(r"\bnpm_[A-Za-z0-9]{36}\b", ("npm_",)),
    DefaultRule(r"\bhf_[A-Za-z]{30,}\b", ("hf_",)),
    # AWS access key ids (long-lived and temporary).
    DefaultRule(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", ("akia", "asia")),
    # Google API keys.
    DefaultRule(r"\bAIza[0-9A-Za-z_-]{35}", ("aiza",)),
    # Slack tokens and webhook URLs; Discord webhook URLs.
    DefaultRule(r"\bxox[abposr]-[A-Za-z0-9-]{10,}", ("xox",)),
    DefaultRule(r"(?i)hooks\.slack\.com/(?P<secret>(?:services|workflows|triggers)/[A-Za-z0-9/_-]+)", ("hooks.slack",)),
    DefaultRule(r"(?i)discord(?:app)?\.com/api/webhooks/(?P<secret>[0-9]+/[A-Za-z0-9_-]+)", ("/webhooks/",)),
    # SendGrid API keys.
    DefaultRule(r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}", ("sg.",)),
    # JSON Web Tokens (header.payload.signature; an unsigned one has no signature).
    DefaultRule(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", ("eyj",)),
    # PEM private keys, also cut short (a message truncated mid-key): up to the next "-----", END line included.
    DefaultRule(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[^-]|-(?!----))*(?:-----END [A-Z ]*PRIVATE KEY-----)?", ("private key",)
    ),
)


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    secret_groups: tuple[str, ...]
    hints: tuple[str, ...]  # empty: always searched

    def apply(self, text: str, lowered: str) -> str:
        if self.hints:
            for hint in self.hints:
                if hint in lowered:
                    break
            else:
                return text
        return self.regex.sub(self._replacement, text)

    def _replacement(self, match: re.Match[str]) -> str:
        if not self.secret_groups:
            return REDACTED
        spans = sorted(match.span(name) for name in self.secret_groups if match.start(name) < match.end(name))
        start, end = match.span()
        pieces, position = [], start
        for group_start, group_end in spans:
            pieces += [match.string[position:group_start], REDACTED]
            position = group_end
        pieces.append(match.string[position:end])
        return "".join(pieces)


@dataclass(frozen=True)
class _RuleSet:
    rules: tuple[_Rule, ...]
    # Every hint of the default rules: a text without one (or too short) skips them all.
    hints: tuple[str, ...]

    def apply(self, text: str) -> str:
        lowered = text.lower()
        hinted = False
        if len(text) >= MIN_RULE_MATCH_LENGTH:
            for hint in self.hints:
                if hint in lowered:
                    hinted = True
                    break
        for rule in self.rules:
            if hinted or not rule.hints:
                text = rule.apply(text, lowered)
        return text


def _rule_set(extra: Iterable[str]) -> _RuleSet:
    rules = []
    for pattern, hints in (*((rule.pattern, rule.hints) for rule in REDACTION_RULES), *((p, ()) for p in extra)):
        regex = re.compile(pattern)  # the deployment's were checked at start-up (reliability_console.config)
        groups = tuple(name for name in regex.groupindex if name.startswith(SECRET_GROUP_PREFIX))
        rules.append(_Rule(regex, groups, hints))
    return _RuleSet(tuple(rules), tuple(sorted({hint for rule in REDACTION_RULES for hint in rule.hints})))


# (the settings' list of extra rules, the rule set compiled from it): rebuilt only when the list is replaced.
_compiled: tuple[Any, _RuleSet | None] = (None, None)


def _configured_rules() -> _RuleSet:
    global _compiled
    extra = engine_settings.REDACT_PATTERNS
    seen, rule_set = _compiled
    if rule_set is None or seen is not extra:
        rule_set = _rule_set(extra)
        _compiled = (extra, rule_set)
    return rule_set


@lru_cache(maxsize=8)
def _key_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret-shaped part, and every one of ``secrets``, replaced by ``[redacted]``."""
    text = _configured_rules().apply(text)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: Any, pattern: str | None = None, _depth: int = 0, *, secrets: Iterable[str] = ()) -> Any:
    """Return a copy of ``value``: secret-looking keys' values replaced, every string redacted as text.

    ``pattern`` is the key-name rule (default ``RELIABILITY_REDACT_PATTERN``);
    ``secrets`` are literal values to remove as well (``input_secrets``).
    """
    key_regex = _key_regex(pattern if pattern is not None else engine_settings.REDACT_PATTERN)
    return _redact(value, key_regex, tuple(secrets), _depth)


def _redact(value: Any, key_regex: re.Pattern[str], secrets: tuple[str, ...], depth: int) -> Any:
    if depth > MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {
            key: REDACTED if key_regex.search(str(key)) else _redact(item, key_regex, secrets, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item, key_regex, secrets, depth + 1) for item in value]
    return value


# A parameter name that says its value is a credential, as the last part of the name: access_token, X-Amz-Signature.
_SECRET_PARAMETER = re.compile(r"(?i)(?<![A-Za-z0-9])(?:" + _SECRET_NAMES + r")$")
# A URL's query string in free text: from "?" to a space, a quote, a bracket, "#" or a backslash (an escape).
_QUERY_IN_TEXT = re.compile(r"\?([^\s'\"<>#\\]+)")


def redact_query(query: str) -> str:
    """A URL's query string (without its "?") with every credential's value ``[redacted]``.

    A parameter is one when its name matches ``RELIABILITY_REDACT_PATTERN`` or
    names a credential (``access_token``, ``api_key``, ``X-Amz-Signature``), or
    when its value, decoded, holds anything ``redact_text`` redacts; the other
    parameters stay as they were.
    """
    key_regex = _key_regex(engine_settings.REDACT_PATTERN)
    parameters = []
    for parameter in query.split("&"):
        name, equals, value = parameter.partition("=")
        if equals and value and value != REDACTED:
            plain_name = unquote_plus(name)
            plain_value = unquote_plus(value)
            # Decoded first: ?next=/admin/%3Ftoken%3D… holds a query, and a token, of its own.
            if (
                key_regex.search(plain_name)
                or _SECRET_PARAMETER.search(plain_name)
                or redact_text(plain_value) != plain_value
            ):
                value = REDACTED
        parameters.append(f"{name}{equals}{value}")
    return "&".join(parameters)


def query_strings_redacted(text: str) -> str:
    """``text`` (a log line, a request line) with every URL's query string passed through ``redact_query``."""
    if "?" not in text:
        return text
    return _QUERY_IN_TEXT.sub(lambda match: "?" + redact_query(match.group(1)), text)


def input_secrets(value: Any, pattern: str | None = None) -> tuple[str, ...]:
    """The values held under secret-looking keys of a task's input, longest first (to look for in text)."""
    key_regex = _key_regex(pattern if pattern is not None else engine_settings.REDACT_PATTERN)
    found: set[str] = set()
    _collect(value, key_regex, False, found, 0)
    return tuple(sorted(found, key=len, reverse=True))


def _collect(value: Any, key_regex: re.Pattern[str], secret: bool, found: set[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _collect(item, key_regex, secret or bool(key_regex.search(str(key))), found, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, key_regex, secret, found, depth + 1)
    elif secret and isinstance(value, str | int | float) and not isinstance(value, bool):
        text = str(value)
        if len(text) >= MIN_SECRET_LENGTH:
            found.add(text)


class TaskRedactor:
    """Redacts what one task's steps said or returned: the rules plus its own input's secrets."""

    def __init__(self, task_input: Any) -> None:
        self.secrets = input_secrets(task_input)

    def text(self, text: str) -> str:
        return redact_text(text, self.secrets) if text else text

    def value(self, value: Any) -> Any:
        return redact(value, secrets=self.secrets)


def task_redactor(task: Any) -> TaskRedactor:
    """The redactor of ``task``, built once per task object (its input does not change)."""
    redactor = task.__dict__.get("_redactor")
    if redactor is None:
        redactor = task.__dict__["_redactor"] = TaskRedactor(task.input)
    return redactor
