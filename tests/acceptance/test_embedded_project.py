"""The engine and the console inside someone else's Django project: issue 20's main acceptance test.

A fresh ``django-admin startproject`` in a temporary directory, with this checkout installed from a wheel (not
editable), twice: on the newest supported Django (6.1, Python 3.12) with psycopg 3 and ``django.tasks``; and on
Django 5.2 LTS (Python 3.11) with psycopg2 and the ``django-tasks`` backport (the extra ``[tasks]``). The project
adds only what docs/embedding.md ("Add it to your Django project") lists: the three apps, ``RQ_QUEUES``, ``TASKS`` with
the engine's backend, and one ``include("dlq.urls")`` beside its own admin; plus its own database (a fresh one of
this test) and an app ``shop`` with a model, an ``@task`` module and a ``pipelines.py``. ``migrate``, a real worker
(``manage.py rqworker --with-scheduler``) and the sweeper (``manage.py run_sweeper``) from that venv, then a
script run with the venv's python drives the scenario and reports what it saw; the test judges the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from devtools.pythons import python_for
from tests.support import LOG_DIR, checkout_wheel, throwaway_database

pytestmark = pytest.mark.acceptance


@dataclass(frozen=True)
class Flavour:
    python: str  # major.minor, found as scripts/ci_matrix.py finds it (pyenv's newest patch release)
    django: str  # a pip requirement
    extras: str  # the wheel's extras: the driver, and the backport where Django has no django.tasks
    tasks_module: str  # where the project imports @task from

    @property
    def release(self) -> str:
        return self.django.split(">=")[1].split(",")[0]  # "6.1" of "Django>=6.1,<6.2"

    @property
    def id(self) -> str:
        return f"django{self.release}-{self.extras.split(',')[0]}"


FLAVOURS = [
    Flavour("3.12", "Django>=6.1,<6.2", "psycopg,tasks", "django.tasks"),
    Flavour("3.11", "Django>=5.2,<5.3", "psycopg2,tasks", "django_tasks"),
]
PIP_TIMEOUT_SECONDS = 300
COMMAND_TIMEOUT_SECONDS = 120
# The scenario script's own bound on each wait (a task's retry waits for its backoff and the sweeper's period).
SCENARIO_WAIT_SECONDS = 60

SETTINGS_ADDITIONS = """
# --- docs/embedding.md, "Add it to your Django project" ---
INSTALLED_APPS += ["shop", "tasks", "django_rq", "dlq"]
RQ_QUEUES = {{name: {{"URL": {redis_url!r}}} for name in ("critical", "default", "bulk")}}
TASKS = {{"default": {{"BACKEND": "tasks.backends.ReliabilityBackend"}}}}
# --- this test's own database ---
DATABASES = {{"default": {database!r}}}
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/", include("dlq.urls")),
]
"""

SHOP_FILES = {
    "__init__.py": "",
    "models.py": """
        from django.db import models


        class Order(models.Model):
            reference = models.CharField(max_length=40, unique=True)
            written_by = models.CharField(max_length=40)
    """,
    "tasks.py": """
        from {tasks_module} import task

        from shop.models import Order
        from tasks.exceptions import TransientError


        @task
        def order_create(reference: str) -> dict:
            order = Order.objects.create(reference=reference, written_by="task")
            return {"id": order.pk, "reference": order.reference}


        @task(takes_context=True)
        def order_create_after_a_blip(context, reference: str) -> dict:
            if context.attempt == 1:
                raise TransientError("the warehouse was busy")
            order = Order.objects.create(reference=reference, written_by="task")
            return {"id": order.pk}


        @task
        def order_refuse(reference: str) -> None:
            raise ValueError(f"no product for {reference}")
    """,
    "pipelines.py": """
        from shop.models import Order
        from tasks import Pipeline

        fulfilment = Pipeline("shop_fulfilment")


        @fulfilment.step(transactional=True)
        def record_order(ctx):
            order = Order.objects.create(reference=ctx.input["reference"], written_by="pipeline")
            return {"order_id": order.pk}
    """,
}

# Run with the venv's python in the project's directory: drives the scenario, prints one JSON report.
SCENARIO = """
import json, time
import django
django.setup()
from datetime import timedelta
import django_rq
from django.contrib.auth import get_user_model
from django.db import transaction
from {tasks_module}.exceptions import TaskResultDoesNotExist
from django.test import Client
from django.utils import timezone
from shop.models import Order
from shop.tasks import order_create, order_create_after_a_blip, order_refuse
from tasks.models import DeadLetter, Task
from tasks.submission.submit import task_submit

WAIT_SECONDS = {wait}


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out after {{WAIT_SECONDS}} s waiting for {{what}}")


def finished(result):
    def done():
        result.refresh()
        return result.is_finished
    wait_for(done, f"task {{result.id}}")
    return result


report = {{"django": django.get_version()}}


class RolledBack(Exception):
    pass


# First, while the queues are empty: a rolled-back transaction enqueues nothing.
try:
    with transaction.atomic():
        rolled = order_create.enqueue("rolled-back")
        raise RolledBack
except RolledBack:
    pass
try:
    order_create.get_result(rolled.id)
    report["rolled_back_result"] = "found"
except TaskResultDoesNotExist:
    report["rolled_back_result"] = "none"
report["rolled_back_rows"] = Task.objects.filter(pk=rolled.id).count()
report["rolled_back_jobs"] = sum(django_rq.get_queue(name).count for name in ("critical", "default", "bulk"))

run_after = timezone.now() + timedelta(seconds=3)
delayed = order_create.using(run_after=run_after).enqueue("delayed")
ok = order_create.enqueue("plain")
blip = order_create_after_a_blip.enqueue("after-a-blip")
bad = order_refuse.enqueue("refused")
pipeline_task = task_submit(pipeline="shop_fulfilment", input={{"reference": "from-the-pipeline"}})

finished(ok)
fetched = order_create.get_result(ok.id)
report["ok"] = {{"status": str(fetched.status), "return_value": fetched.return_value,
                "order_written_by": Order.objects.get(reference="plain").written_by}}
finished(blip)
report["blip"] = {{"status": str(blip.status), "attempts": blip.attempts,
                  "order": Order.objects.filter(reference="after-a-blip").exists()}}
finished(bad)
report["bad"] = {{"status": str(bad.status), "exception_classes": [e.exception_class_path for e in bad.errors],
                 "dead_letters": DeadLetter.objects.filter(task_id=bad.id).count()}}
wait_for(lambda: Task.objects.get(pk=pipeline_task.pk).is_terminal, "the pipeline's task")
report["pipeline"] = {{"state": Task.objects.get(pk=pipeline_task.pk).state,
                      "order_written_by": Order.objects.get(reference="from-the-pipeline").written_by}}
finished(delayed)
report["delayed"] = {{"status": str(delayed.status), "run_after": run_after.isoformat(),
                     "started_at": delayed.started_at.isoformat(),
                     "enqueued_at": delayed.enqueued_at.isoformat()}}

# The console in the project's own admin site (Django's AdminSite, at the project's /admin/).
user = get_user_model().objects.create_superuser("shop-admin", "admin@example.com", "embedded-test-pw-1")
client = Client(HTTP_HOST="localhost")
client.force_login(user)
item = DeadLetter.objects.get(task_id=bad.id)
pages = {{}}
for url in ("/admin/", "/admin/dlq/dlqitem/", f"/admin/dlq/dlqitem/{{item.pk}}/change/", "/ops/admin/dashboard/",
            "/ops/admin/queues/", "/ops/admin/pipelines/"):
    response = client.get(url)
    pages[url] = [response.status_code, response.content.decode()]
report["pages"] = {{url: status for url, (status, _) in pages.items()}}
report["index_links_dashboard"] = 'href="/ops/admin/dashboard/"' in pages["/admin/"][1]
report["item_page_names_the_class"] = "ValueError" in pages[f"/admin/dlq/dlqitem/{{item.pk}}/change/"][1]
from django.contrib import admin
admin.site.name  # the lazy default site, built
report["admin_site_class"] = type(admin.site._wrapped).__name__
print(json.dumps(report))
"""


def run(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path, timeout: float = COMMAND_TIMEOUT_SECONDS):
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with open(log, "a") as output:
        output.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}[exit {result.returncode}]\n")
    return result


@pytest.fixture(scope="module", params=FLAVOURS, ids=lambda flavour: flavour.id)
def flavour_venv(request, tmp_path_factory) -> tuple[Flavour, Path]:
    """A fresh venv of the flavour's Python and Django, its driver and this checkout's wheel (with its extras)."""
    flavour = request.param
    interpreter = python_for(flavour.python)
    base = tmp_path_factory.mktemp(f"embedded-venv-{flavour.id}")
    venv = base / "venv"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"embedded-project-pip-{flavour.id}.log"
    log.write_text("")
    env = {**os.environ, "PIP_CACHE_DIR": str(base / "pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    python = venv / "bin" / "python"
    started = time.monotonic()
    wheel = checkout_wheel(base, env=env, log=log, timeout=PIP_TIMEOUT_SECONDS)
    result = run([interpreter, "-m", "venv", str(venv)], cwd=base, env=env, log=log, timeout=PIP_TIMEOUT_SECONDS)
    assert result.returncode == 0, f"creating the venv failed, see {log}"
    install = [str(python), "-m", "pip", "install", "--quiet", f"{wheel}[{flavour.extras}]", flavour.django]
    result = run(install, cwd=base, env=env, log=log, timeout=PIP_TIMEOUT_SECONDS)
    assert result.returncode == 0, f"pip install of the wheel failed, see {log}"
    with open(log, "a") as output:
        output.write(f"venv ready in {time.monotonic() - started:.1f} s\n")
    return flavour, python


@pytest.fixture
def fresh_database():
    with throwaway_database("rc_embedded") as db:
        yield {"ENGINE": "django.db.backends.postgresql", **db}


@pytest.fixture
def embedded_project(flavour_venv, fresh_database, clean_redis, tmp_path):
    """``startproject mysite`` with docs/embedding.md's additions and the ``shop`` app; migrated; its python and env."""
    flavour, python = flavour_venv
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "RELIABILITY_"))}
    env.pop("PYTHONPATH", None)
    env.pop("DATABASE_URL", None)
    env.update(PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="mysite.settings")
    log = LOG_DIR / f"embedded-project-{os.getpid()}-{time.monotonic_ns()}.log"
    django_admin = str(python.parent / "django-admin")
    result = run([django_admin, "startproject", "mysite", str(tmp_path)], cwd=tmp_path, env=env, log=log)
    assert result.returncode == 0, result.stderr
    project_settings = tmp_path / "mysite" / "settings.py"
    additions = SETTINGS_ADDITIONS.format(redis_url=settings.REDIS_URL, database=fresh_database)
    project_settings.write_text(project_settings.read_text() + additions)
    (tmp_path / "mysite" / "urls.py").write_text(URLS.lstrip())
    (tmp_path / "shop").mkdir()
    for name, text in SHOP_FILES.items():
        text = textwrap.dedent(text).lstrip().replace("{tasks_module}", flavour.tasks_module)
        (tmp_path / "shop" / name).write_text(text)
    for command in (["makemigrations", "shop"], ["migrate", "--no-input"]):
        result = run([str(python), "manage.py", *command], cwd=tmp_path, env=env, log=log)
        assert result.returncode == 0, result.stderr[-3000:]
    return python, tmp_path, env, log, flavour


def test_an_embedding_project_runs_tasks_and_pipelines_and_shows_failures_in_its_own_admin(embedded_project):
    python, project, env, log, flavour = embedded_project
    children, outputs = [], []
    try:
        for name, command in (("worker", ["rqworker", "--with-scheduler"]), ("sweeper", ["run_sweeper"])):
            outputs.append(open(LOG_DIR / f"embedded-{name}-{os.getpid()}-{time.monotonic_ns()}.log", "wb"))
            argv = [str(python), "manage.py", *command]
            child = subprocess.Popen(argv, cwd=project, env=env, stdout=outputs[-1], stderr=subprocess.STDOUT)
            children.append(child)
        scenario = project / "scenario.py"
        scenario.write_text(SCENARIO.format(wait=SCENARIO_WAIT_SECONDS, tasks_module=flavour.tasks_module))
        result = run([str(python), str(scenario)], cwd=project, env=env, log=log, timeout=4 * SCENARIO_WAIT_SECONDS)
        assert all(child.poll() is None for child in children), f"a worker or the sweeper stopped, see {LOG_DIR}"
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for output in outputs:
            output.close()
    assert result.returncode == 0, result.stderr[-3000:] or result.stdout[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["django"].startswith(f"{flavour.release}."), report["django"]

    assert report["rolled_back_result"] == "none"
    assert report["rolled_back_rows"] == 0 and report["rolled_back_jobs"] == 0

    assert report["ok"] == {
        "status": "SUCCESSFUL",
        "return_value": {"id": report["ok"]["return_value"]["id"], "reference": "plain"},
        "order_written_by": "task",
    }
    assert report["blip"] == {"status": "SUCCESSFUL", "attempts": 2, "order": True}
    assert report["bad"]["status"] == "FAILED"
    assert report["bad"]["exception_classes"] == ["builtins.ValueError"]
    assert report["bad"]["dead_letters"] == 1
    assert report["pipeline"] == {"state": "succeeded", "order_written_by": "pipeline"}

    delayed = report["delayed"]
    assert delayed["status"] == "SUCCESSFUL"
    assert delayed["started_at"] >= delayed["run_after"] > delayed["enqueued_at"]

    assert report["admin_site_class"] == "AdminSite"  # the project's own site, not the standalone console's
    assert set(report["pages"].values()) == {200}, report["pages"]
    assert report["index_links_dashboard"] and report["item_page_names_the_class"]


def test_check_is_clean_and_names_a_missing_rq_queues_in_one_line(embedded_project):
    python, project, env, log, _ = embedded_project
    clean = run([str(python), "manage.py", "check"], cwd=project, env=env, log=log)
    assert clean.returncode == 0, clean.stderr
    assert "System check identified no issues (0 silenced)." in clean.stdout
    assert "WARNING" not in clean.stdout + clean.stderr

    (project / "mysite" / "settings_without_queues.py").write_text("from mysite.settings import *\n\ndel RQ_QUEUES\n")
    broken = run(
        [str(python), "manage.py", "check"],
        cwd=project,
        env={**env, "DJANGO_SETTINGS_MODULE": "mysite.settings_without_queues"},
        log=log,
    )
    assert broken.returncode != 0
    errors = [line for line in broken.stderr.splitlines() if "RQ_QUEUES" in line]
    assert len(errors) == 1, broken.stderr
    assert "ERROR" in broken.stderr and "1 issue" in broken.stderr, broken.stderr
