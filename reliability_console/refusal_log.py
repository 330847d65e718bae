"""A refused request is logged as one line, not as an error with its traceback.

Django's ``django.request`` logger records every ``PermissionDenied`` as a
warning with ``exc_info``: a traceback of some 35 lines for each forged POST,
so a viewer replaying one could write thousands of log lines a minute. A
refusal is an audited event, not a failure: ``dlq.audit.audit_denied`` logs
one line of its own (``event=permission_denied`` with the actor, the action
and the target) and marks the request with ``refusal_logged()``; this filter,
on ``django.request`` (``LOGGING`` in settings), then drops Django's record of
that 403, and takes the traceback off any other 403 it logs (a refusal nobody
audited, a GET of a page the user may not see). Errors (5xx) keep theirs.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from django.core.exceptions import PermissionDenied
from django.core.signals import request_started

# Whether the refusal of the request being handled was logged already. A thread serves one request at a time and
# the mark is cleared when the next one starts, so it never outlives its request.
_refusal_logged: ContextVar[bool] = ContextVar("refusal_logged", default=False)


def refusal_logged() -> None:
    """Mark the current request's refusal as logged: Django's own record of its 403 is dropped."""
    _refusal_logged.set(True)


def _request_started(**kwargs) -> None:
    _refusal_logged.set(False)


request_started.connect(_request_started, dispatch_uid="reliability_console.refusal_log")


class RefusalFilter(logging.Filter):
    """For ``django.request``: a ``PermissionDenied`` is logged once, without its traceback (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, PermissionDenied):
            return True
        if _refusal_logged.get():
            return False
        record.exc_info = None
        record.exc_text = None
        return True
