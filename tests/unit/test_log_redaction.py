"""Log lines hold no credential from a URL: the project's formatter and gunicorn's logger class.

The whole path through a real gunicorn is tests/acceptance/test_query_tokens_live.py.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace

from django.test import RequestFactory
from gunicorn.config import Config

from reliability_console.gunicorn_logging import RedactingLogger
from reliability_console.logging import StructuredFormatter

TOKEN = "rc_" + "Zx9-Qm_4TtLwB2nKcV7yHs1eRj8uPaDf3GoXi0bNlMq"


def test_the_formatter_redacts_the_query_of_a_logged_request_and_of_the_message():
    request = RequestFactory().get(f"/api/v1/tasks?token={TOKEN}&limit=2")
    record = logging.makeLogRecord(
        {
            "name": "django.request",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "calling %s",
            "args": (f"https://example.com/hook?api_key={TOKEN}",),
            "request": request,
            "status_code": 401,
            "fencing_token": 5,
        }
    )
    line = StructuredFormatter().format(record)
    assert TOKEN not in line
    assert "calling https://example.com/hook?api_key=[redacted]" in line
    assert "/api/v1/tasks?token=[redacted]&limit=2" in line
    assert "fencing_token=5" in line and "status_code=401" in line


def test_runservers_request_lines_go_through_the_formatter(settings):
    # Django's own handler for django.server would print the request line whole.
    from django.utils.log import ServerFormatter

    handlers = logging.getLogger("django.server").handlers
    assert not any(isinstance(h.formatter, ServerFormatter) for h in handlers), handlers
    (handler,) = [h for h in handlers if isinstance(h.formatter, StructuredFormatter)]
    record = logging.makeLogRecord(
        {
            "name": "django.server",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": '"%s" %s %s',
            "args": (f"GET /api/v1/tasks?token={TOKEN} HTTP/1.1", 401, 55),
            "status_code": 401,
        }
    )
    line = handler.format(record)
    assert TOKEN not in line and "/api/v1/tasks?token=[redacted]" in line


def test_gunicorns_access_atoms_hold_no_credential():
    logger = RedactingLogger(Config())
    environ = {
        "REQUEST_METHOD": "GET",
        "RAW_URI": f"/api/v1/tasks?access_token={TOKEN}&limit=2",
        "PATH_INFO": "/api/v1/tasks",
        "QUERY_STRING": f"access_token={TOKEN}&limit=2",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_REFERER": f"https://example.com/?token={TOKEN}",
        "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
    }
    request = SimpleNamespace(headers=[("AUTHORIZATION", f"Bearer {TOKEN}"), ("X-API-KEY", TOKEN)])
    response = SimpleNamespace(status="401 Unauthorized", headers=[], sent=115)
    atoms = logger.atoms(response, request, environ, timedelta(milliseconds=3))
    assert atoms["r"] == "GET /api/v1/tasks?access_token=[redacted]&limit=2 HTTP/1.1"
    assert atoms["q"] == "access_token=[redacted]&limit=2"
    assert atoms["f"] == "https://example.com/?token=[redacted]"
    assert atoms["{authorization}i"] == atoms["{x-api-key}i"] == atoms["{http_authorization}e"] == "[redacted]"
    assert atoms["U"] == "/api/v1/tasks" and atoms["s"] == "401"
    assert not [name for name, value in atoms.items() if TOKEN in str(value)]


def test_gunicorns_error_log_messages_lose_their_queries(caplog, monkeypatch):
    logger = RedactingLogger(Config())
    monkeypatch.setattr(logger.error_log, "propagate", True)  # to caplog's handler, for this test only
    with caplog.at_level(logging.ERROR, logger="gunicorn.error"):
        logger.error("Error handling request %s", f"/api/v1/tasks?token={TOKEN}")
    assert set(caplog.messages) == {"Error handling request /api/v1/tasks?token=[redacted]"}
