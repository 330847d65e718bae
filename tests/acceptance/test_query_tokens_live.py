"""A token sent in a query string is refused and written to no log line, at any level.

Issue 25, finding (b): ``?token=rc_…`` got its 401, and the whole URL, token
included, went to the web log as a WARNING (django.request passes the
request, whose repr holds the full path). gunicorn serves the project as in
production, with its access log on and every logger at DEBUG; the test reads
everything the server wrote (stdout and stderr).
"""

from __future__ import annotations

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]


def test_a_query_string_token_appears_in_no_log_line(start_api_server):
    server = start_api_server(
        extra_args=["--access-logfile", "-", "--log-level", "debug"], RELIABILITY_LOG_LEVEL="DEBUG"
    )
    token = api_client_create(name="query-client")[1]
    other = api_client_create(name="other-client")[1]
    api = f"{server.url}/api/v1"
    answers = {
        "token": requests.get(f"{api}/tasks?token={token}", timeout=10),
        "access_token": requests.get(f"{api}/tasks?limit=5&access_token={token}", timeout=10),
        "api_key": requests.get(f"{api}/tasks?api_key={token}&limit=5", timeout=10),
        # An innocent name: only the token's shape says what it is.
        "q": requests.get(f"{api}/tasks?q={token}", timeout=10),
        # Authenticated by header, the token in the URL anyway; a 400 and a 404 are logged by django.request too.
        "with header": requests.get(
            f"{api}/tasks?token={token}", headers={"Authorization": f"Bearer {other}"}, timeout=10
        ),
        "bad body": requests.post(
            f"{api}/tasks?token={token}",
            data="{not json",
            headers={"Authorization": f"Bearer {other}", "Content-Type": "application/json"},
            timeout=10,
        ),
        "not found": requests.get(
            f"{api}/tasks/not-a-task?access_token={token}", headers={"Authorization": f"Bearer {other}"}, timeout=10
        ),
        # The admin sends the URL on as ?next= (URL-encoded) to its login page, which is requested next.
        "admin": requests.get(f"{server.url}/admin/?token={token}", timeout=10),
    }
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {
        "token": 401,
        "access_token": 401,
        "api_key": 401,
        "q": 401,
        "with header": 200,
        "bad body": 400,
        "not found": 404,
        "admin": 200,
    }
    assert answers["admin"].history[0].status_code == 302 and token in answers["admin"].url

    # gunicorn writes an access line once the response is sent: the last request's line closes the log.
    wait_for(lambda: '"GET /admin/login/?' in server.process.output(), timeout=10, message="the last access line")
    output = server.process.output()
    assert "Unauthorized: /api/v1/tasks" in output and "DEBUG" in output  # django.request and DEBUG were on
    assert 'GET /api/v1/tasks?token=[redacted] HTTP/1.1" 401' in output
    assert 'GET /api/v1/tasks?limit=5&access_token=[redacted] HTTP/1.1" 401' in output
    assert 'GET /api/v1/tasks?api_key=[redacted]&limit=5 HTTP/1.1" 401' in output
    assert 'GET /admin/login/?next=[redacted] HTTP/1.1" 200' in output
    leaks = [line for line in output.splitlines() if token in line or token[3:20] in line]
    assert leaks == []
