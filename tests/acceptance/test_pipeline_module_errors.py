"""A pipeline module that does not import stops web, workers and the sweeper at start-up, with one line.

Each real command runs as a subprocess with a bogus ``RELIABILITY_PIPELINE_MODULES``:
a module that does not exist, one that raises when imported and one with a
syntax error. Each must exit non-zero at once and say, on one line, which
module failed and why: not a traceback, not a worker that starts and then
fails every task of the pipeline.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from chaos.processes import free_port, gunicorn_argv
from tests.support import ROOT, manage, process_env

pytestmark = pytest.mark.acceptance

# Enough for Django to start on a loaded machine; a command that is still running after it started wrongly.
START_TIMEOUT_SECONDS = 60

MODULES = {
    "acme_missing.orders": None,
    "acme_raises": (
        "from tasks import Pipeline\n\norders = Pipeline('acme_raises')\nCHARGE_URL = base_url + '/charges'\n"
    ),
    "acme_syntax": "def charge(ctx:\n    return {}\n",
}
CAUSES = {
    "acme_missing.orders": "ModuleNotFoundError: No module named 'acme_missing'",
    "acme_raises": "NameError: name 'base_url' is not defined (",
    "acme_syntax": "SyntaxError: ",
}

COMMANDS = {
    "gunicorn": lambda: gunicorn_argv(free_port(), processes=2),
    "runserver": lambda: manage("runserver", f"127.0.0.1:{free_port()}"),
    "rqworker": lambda: manage("rqworker", "--with-scheduler"),
    "run_sweeper": lambda: manage("run_sweeper"),
}


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pipeline-modules")
    for name, source in MODULES.items():
        if source is not None:
            (directory / f"{name}.py").write_text(source)
    return directory


def run_until_exit(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    # Own process group: a command that wrongly keeps running (runserver's reloader has a child) is killed whole.
    process = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0
    )
    try:
        stdout, stderr = process.communicate(timeout=START_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{argv[1:3]} was still running after {START_TIMEOUT_SECONDS} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_pipeline_module_that_does_not_import_stops_the_process_with_one_line(command, module, module_dir):
    env = process_env(
        RELIABILITY_PIPELINE_MODULES=f"tasks.demo.report_pipeline,{module}",
        PYTHONPATH=os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    result = run_until_exit(COMMANDS[command](), env)

    assert result.returncode != 0
    output = result.stdout + result.stderr
    expected = f"configuration error: RELIABILITY_PIPELINE_MODULES: cannot import {module!r}: {CAUSES[module]}"
    lines = [line for line in output.splitlines() if expected in line]
    assert lines, output[-3000:]
    if command == "gunicorn":
        # gunicorn logs its start and stop around it (each worker says it once): "App failed to load".
        # When two workers fail at once its master may also print its own HaltServer traceback while
        # halting (a long-standing race of gunicorn's), but never one of the import.
        assert "App failed to load" in output
        assert "ImproperlyConfigured" not in output and "wsgi.py" not in output, output[-3000:]
    else:
        assert output.strip() == lines[0], output[-3000:]
