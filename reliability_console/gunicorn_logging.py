"""gunicorn's logger without credentials: ``--logger-class reliability_console.gunicorn_logging.RedactingLogger``.

gunicorn writes its access log and its own errors itself, not through
Django's logging: the request line (``%(r)s``) and the query (``%(q)s``)
hold the whole query string, so a token sent as ``?token=…`` (refused by
the API) was written to the access log. With this class every access-log
atom holding a URL has its query string redacted (``tasks.redaction``),
header and environ atoms that carry a credential are ``[redacted]``, and
so are the query strings in gunicorn's error log ("Error handling request
/path?…").
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.conf import settings
from gunicorn.glogging import Logger

from tasks.redaction import REDACTED, query_strings_redacted, redact_query

# Atoms holding a URL or a request line, and the atoms that are a query string alone.
URL_ATOMS = ("r", "f", "{raw_uri}e", "{http_referer}e", "{referer}i")
QUERY_ATOMS = ("q", "{query_string}e")
# A header ({name}i) or environ ({name}e) atom named like a credential: its whole value goes.
CREDENTIAL_ATOM = re.compile(r"(?i)^\{[^}]*(?:authorization|cookie|token|secret|api[_-]?key|password)[^}]*\}[ie]$")


def _queries_redacted(text: str) -> str:
    if "?" not in text:
        return text
    if not settings.configured:  # the arbiter, before any worker loaded the project: no query at all
        return re.sub(r"\?[^\s'\"<>#]*", f"?{REDACTED}", text)
    return query_strings_redacted(text)


class _QueryRedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _queries_redacted(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


class RedactingLogger(Logger):
    """gunicorn's ``Logger`` whose access and error logs hold no credential from a URL or a header."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        # setup() runs again on every reload (SIGHUP): one filter, not one per reload.
        if not any(isinstance(existing, _QueryRedactingFilter) for existing in self.error_log.filters):
            self.error_log.addFilter(_QueryRedactingFilter())

    def atoms(self, resp: Any, req: Any, environ: dict, request_time: Any) -> dict:
        atoms = super().atoms(resp, req, environ, request_time)
        for name, value in atoms.items():
            if not isinstance(value, str):
                continue
            if CREDENTIAL_ATOM.match(name):
                atoms[name] = REDACTED
            elif name in URL_ATOMS:
                atoms[name] = _queries_redacted(value)
            elif name in QUERY_ATOMS and value:
                atoms[name] = redact_query(value) if settings.configured else REDACTED
        return atoms
