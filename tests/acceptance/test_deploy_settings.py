"""Production HTTPS settings: `check --deploy` is clean with production variables, and a real server enforces them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.support import ROOT, ManagedProcess, gunicorn_argv, process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "pr0duction-like-secret-key-with-enough-length-and-variety-0123456789-abcdefXYZ",
    "DJANGO_ALLOWED_HOSTS": "console.example.com,127.0.0.1",
}


def production_env(**overrides: str) -> dict[str, str]:
    env = process_env(**PRODUCTION, **overrides)
    if "DJANGO_SECURE_HTTPS" not in overrides:
        env.pop("DJANGO_SECURE_HTTPS", None)  # as a production host has it: unset, so HTTPS is on
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_check_deploy_prints_no_warning_with_production_variables():
    result = check_deploy(production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def test_turning_https_off_for_a_plain_http_run_is_what_check_deploy_then_warns_about():
    result = check_deploy(production_env(DJANGO_SECURE_HTTPS="0"))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in output


def test_a_malformed_proxy_header_setting_is_one_clear_line():
    result = check_deploy(production_env(DJANGO_SECURE_PROXY_SSL_HEADER="https"))
    assert result.returncode != 0
    assert "DJANGO_SECURE_PROXY_SSL_HEADER='https' is not '<Header-Name>: <value>'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def production_server():
    env = production_env(DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https")
    server = ManagedProcess("gunicorn-https", gunicorn_argv(port := _free_port(), processes=1, threads=4), env)
    url = f"http://127.0.0.1:{port}"

    def answering():
        if not server.alive():
            raise AssertionError(server.output()[-3000:])
        try:
            return requests.get(url + "/admin/login/", allow_redirects=False, timeout=5)
        except requests.RequestException:
            return None

    try:  # stopped also when it never answers
        wait_for(answering, timeout=30, message="gunicorn to answer")
        yield url
    finally:
        server.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_production_server_redirects_plain_http_and_sends_hsts_and_secure_cookies(production_server):
    plain = requests.get(production_server + "/admin/login/", allow_redirects=False, timeout=5)
    assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
    proxied = requests.get(
        production_server + "/admin/login/", headers={"X-Forwarded-Proto": "https"}, allow_redirects=False, timeout=5
    )
    assert proxied.status_code == 200
    assert proxied.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    csrf_cookie = proxied.headers["Set-Cookie"]
    assert "csrftoken=" in csrf_cookie and "Secure" in csrf_cookie
