"""The wheel as an embedding project gets it: ``pip install`` of this checkout (not editable) into a fresh venv.

A copy of the checkout (its tracked and new files, nothing ignored) is built into a wheel, and the wheel is
installed into a new virtual environment with the database driver this run uses; pip's cache is a temporary
directory. Then, from that venv and with its working directory outside the checkout (so nothing of the source
tree can be imported), ``django check`` passes and a superuser's test client GETs the admin index, the dashboard
and the dead-letter list, in English and in Chinese. The templates and the catalogue must come from the installed
packages: the script reports where each was loaded from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support import LOG_DIR, ROOT, checkout_wheel, process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

PIP_TIMEOUT_SECONDS = 180
RUN_TIMEOUT_SECONDS = 120
PASSWORD = "wheel-test-password-1"  # a throwaway user of the test database
PAGES = ("/admin/", "/admin/dashboard/", "/admin/dlq/dlqitem/")
# Django's driver in this run, installed beside the wheel (the engine depends on neither).
DRIVERS = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary"}

# Run inside the fresh venv: pages by language, and where the templates and the catalogue were loaded from.
RENDER_SCRIPT = """
import json, sys
import django
django.setup()
from django.conf import settings
from django.template.loader import get_template
from django.test import Client
from django.utils import translation
from django.utils.translation import trans_real

client = Client()
# Through the login form: django-axes authenticates only with a request.
login = client.post("/admin/login/?next=/admin/", {"username": "wheel-admin", "password": sys.argv[1]})
assert login.status_code == 302, login.status_code
pages = {}
for language in ("en", "zh-hans"):
    for url in sys.argv[2:]:
        response = client.get(url, headers={"accept-language": language})
        pages[f"{language} {url}"] = [response.status_code, response.content.decode()]
templates = {
    name: get_template(name).origin.name
    for name in ("dlq/admin/index.html", "admin/dashboard.html", "admin/dlq/dlqitem/change_list.html")
}
with translation.override("zh-hans"):
    catalogue = trans_real.translation("zh-hans")
print(json.dumps({
    "pages": pages,
    "templates": templates,
    "catalogue_paths": [str(path) for path in settings.LOCALE_PATHS],
    "modules": {name: sys.modules[name].__file__ for name in ("tasks", "dlq", "reliability_console")},
    "sys_path": sys.path,
    "operations_in_chinese": catalogue.gettext("Operations"),
}))
"""


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[str, Path]:
    """A fresh venv with the wheel of this checkout installed; its python and a directory outside the checkout."""
    base = tmp_path_factory.mktemp("wheel-install")
    venv, outside = base / "venv", base / "elsewhere"
    outside.mkdir()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "wheel-install-pip.log"
    log.write_text("")
    env = {**os.environ, "PIP_CACHE_DIR": str(base / "pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    python = str(venv / "bin" / "python")
    driver = DRIVERS[connection.Database.__name__]
    wheel = checkout_wheel(base, env=env, log=log, timeout=PIP_TIMEOUT_SECONDS)
    with open(log, "a") as output:
        create = [sys.executable, "-m", "venv", str(venv)]
        result = subprocess.run(create, stdout=output, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_SECONDS)
        assert result.returncode == 0, f"creating the venv failed, see {log}"
        install = [python, "-m", "pip", "install", "--quiet", str(wheel), driver]
        result = subprocess.run(install, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=PIP_TIMEOUT_SECONDS)
        assert result.returncode == 0, f"pip install of the wheel failed, see {log}"
        output.write(f"wheel built and installed into a fresh venv in {time.monotonic() - started:.1f} s\n")
    return python, outside


def venv_env(outside: Path) -> dict[str, str]:
    env = process_env(
        DJANGO_SETTINGS_MODULE="reliability_console.settings",
        DJANGO_ALLOWED_HOSTS="testserver",
        RELIABILITY_VAR_DIR=str(outside / "var"),
        # The standalone project's default: the test pipelines live in the checkout, which this venv cannot see.
        RELIABILITY_PIPELINE_MODULES="tasks.demo.report_pipeline",
    )
    env.pop("PYTHONPATH", None)
    return env


def test_the_installed_wheel_checks_clean_and_renders_the_console_in_english_and_chinese(wheel_venv):
    python, outside = wheel_venv
    get_user_model().objects.create_superuser("wheel-admin", "admin@example.com", PASSWORD)
    env = venv_env(outside)
    site_packages = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )

    check = subprocess.run(
        [python, "-m", "django", "check"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert "System check identified no issues" in check.stdout

    run = subprocess.run(
        [python, "-c", RENDER_SCRIPT, PASSWORD, *PAGES],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])

    # Nothing of the checkout on the path: the packages, their templates and catalogue are the installed ones.
    assert not [entry for entry in report["sys_path"] if entry and Path(entry).resolve().is_relative_to(ROOT)]
    for name, origin in {**report["modules"], **report["templates"]}.items():
        assert Path(origin).is_relative_to(site_packages), (name, origin)
    assert (site_packages / "tasks" / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.mo").is_file()
    assert (site_packages / "dlq" / "static" / "dlq" / "dashboard_refresh.js").is_file()
    assert report["operations_in_chinese"] == "运维"

    for key, (status, _) in report["pages"].items():
        assert status == 200, key
    english, chinese = report["pages"]["en /admin/"][1], report["pages"]["zh-hans /admin/"][1]
    # The console's own index (its Operations module), not Django's plain one.
    assert 'id="operator-dashboard-module"' in english and ">Operations<" in english
    assert 'id="operator-dashboard-module"' in chinese and ">运维<" in chinese
    assert "仪表盘" in report["pages"]["zh-hans /admin/dashboard/"][1]
    assert "Dashboard" in report["pages"]["en /admin/dashboard/"][1]
    assert "死信队列" in report["pages"]["zh-hans /admin/dlq/dlqitem/"][1]
    assert "Dead-letter queue" in report["pages"]["en /admin/dlq/dlqitem/"][1]
