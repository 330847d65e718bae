"""`make run`: the whole product on one laptop, started and stopped as one.

Starts (when not configured otherwise) an embedded Redis, the report-platform
simulator with some faults on, the web server, two workers and the sweeper;
migrates, creates an admin account with a generated password, submits demo
tasks. Ctrl-C stops everything it started.

With ``--exit-when-settled`` it waits until the demo tasks reach terminal
states and the admin login page answers, then stops everything and exits 0
(used by the test suite to try ``make run`` as a new user would).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.processes import WORKER_QUEUES  # noqa: E402
from reliability_console.local_redis import redis_server_argv  # noqa: E402

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


def free_port(preferred: int | None = None) -> int:
    if preferred:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise SystemExit(f"make run: {what} did not come up within {timeout:.0f}s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Stack:
    def __init__(self, var_dir: Path, log_dir: Path) -> None:
        self.var_dir = var_dir
        self.log_dir = log_dir
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.env = dict(os.environ)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        # Own process group: Ctrl-C reaches only this supervisor, which then
        # stops the product before the services it depends on.
        process = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        self.processes.append((name, process))
        return process

    def manage(self, *args: str, capture: bool = False) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], env=self.env, cwd=ROOT, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise SystemExit(f"make run: manage.py {' '.join(args)} failed:\n{result.stderr.strip()[-2000:]}")
        return result.stdout

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"make run: {name} exited with code {process.returncode}:\n{tail}")

    def stop(self) -> None:
        # The product first, then what it depends on: a worker finishing its
        # job on SIGTERM still needs Redis and the platform.
        infrastructure = {"redis", "report-platform"}
        product = [p for name, p in self.processes if name not in infrastructure]
        services = [p for name, p in self.processes if name in infrastructure]
        for group in (product, services):
            for process in group:
                if process.poll() is None:
                    process.terminate()
            deadline = time.monotonic() + 20
            for process in group:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def secret_key(var_dir: Path) -> str:
    path = var_dir / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exit-when-settled", action="store_true")
    parser.add_argument("--settle-timeout", type=float, default=240)
    options = parser.parse_args()

    var_dir = Path(os.environ.get("RELIABILITY_VAR_DIR") or ROOT / "var").resolve()
    log_dir = var_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(var_dir, log_dir)
    env = stack.env
    env["RELIABILITY_VAR_DIR"] = str(var_dir)
    env.setdefault("DJANGO_SECRET_KEY", secret_key(var_dir))
    env.setdefault("DJANGO_DEBUG", "0")
    # A local run serves plain HTTP on 127.0.0.1: no HTTPS redirect, no secure-only cookies.
    env.setdefault("DJANGO_SECURE_HTTPS", "0")
    env["PYTHONUNBUFFERED"] = "1"
    web_port = free_port(int(env.get("PORT", "8000")))
    # /metrics for a local Prometheus: this run's processes share a fresh multiprocess
    # directory, and only this machine may scrape.
    if not env.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = var_dir / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    env.setdefault("RELIABILITY_METRICS_ALLOWED_NETWORKS", "127.0.0.1/32,::1/128")
    env.setdefault("RELIABILITY_CONSOLE_URL", f"http://127.0.0.1:{web_port}")

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    # Explicit: a shell that started us in the background may have set SIGINT to "ignore".
    signal.signal(signal.SIGINT, on_signal)
    try:
        if not env.get("REDIS_URL"):
            redis_port = free_port(6390)
            redis_dir = var_dir / "redis"
            redis_dir.mkdir(exist_ok=True)
            stack.start("redis", redis_server_argv(redis_port, str(redis_dir)))
            env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
            wait_until(lambda: _redis_ping(redis_port), 20, "embedded Redis")
        if not env.get("REPORT_PLATFORM_URL"):
            sim_port = free_port(8765)
            stack.start(
                "report-platform",
                [
                    sys.executable,
                    "manage.py",
                    "run_report_platform",
                    "--port",
                    str(sim_port),
                    "--fail-rate",
                    "0.08",
                    "--throttle-rate",
                    "0.08",
                    "--retry-after",
                    "1",
                    "--insufficient-users",
                    "demo-broke",
                    "--seed",
                    "7",
                ],
            )
            env["REPORT_PLATFORM_URL"] = f"http://127.0.0.1:{sim_port}"
            health = env["REPORT_PLATFORM_URL"] + "/_sim/health"
            # A simulator that exits at start-up (a configuration error) says why at once, not after the wait.
            wait_until(lambda: (stack.check_alive(), http_ok(health))[1], 30, "report platform simulator")
            _script_flaky_user(env["REPORT_PLATFORM_URL"])

        print("make run: migrating the database…", flush=True)
        stack.manage("migrate", "--noinput")
        stack.manage("collectstatic", "--noinput")
        stack.manage("setup_roles")
        admin_line = stack.manage("bootstrap_admin", "--username", "admin").strip()
        api_token = stack.manage("create_api_token", f"demo-{secrets.token_hex(3)}").strip().splitlines()[-1]

        stack.start(
            "web",
            [
                sys.executable,
                "-m",
                "gunicorn",
                "reliability_console.wsgi:application",
                "--bind",
                f"127.0.0.1:{web_port}",
                "--workers",
                "2",
                "--access-logfile",
                "-",
                "--logger-class",
                "reliability_console.gunicorn_logging.RedactingLogger",
            ],
        )
        for index in (1, 2):
            # Every engine queue, highest priority first: a critical job never waits behind the bulk backlog.
            worker_argv = [sys.executable, "manage.py", "rqworker", "--with-scheduler", *WORKER_QUEUES]
            stack.start(f"worker-{index}", worker_argv)
        stack.start("sweeper", [sys.executable, "manage.py", "run_sweeper"])
        login_url = f"http://127.0.0.1:{web_port}/admin/login/"
        wait_until(lambda: (stack.check_alive(), http_ok(login_url))[1], 60, "web server")

        task_ids = stack.manage("submit_demo_tasks").split()
        print(
            f"\nReliability Console is running.\n"
            f"  admin:    {login_url}\n"
            f"  account:  {admin_line}\n"
            f"  API:      http://127.0.0.1:{web_port}/api/v1/docs\n"
            f"  token:    export TOKEN={api_token}\n"
            f"  platform: {env['REPORT_PLATFORM_URL']} (simulator, faults on)\n"
            f"  logs:     {log_dir}\n"
            f"  {len(task_ids)} demo tasks submitted; press Ctrl-C to stop everything.\n",
            flush=True,
        )
        if options.exit_when_settled:
            states = _wait_settled(stack, task_ids, options.settle_timeout)
            print("make run: demo tasks settled: " + json.dumps(states, sort_keys=True), flush=True)
            if not http_ok(login_url):
                raise SystemExit("make run: admin login page stopped answering")
            return 0
        while True:
            stack.check_alive()
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nmake run: stopping…", flush=True)
        return 0
    finally:
        stack.stop()


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _script_flaky_user(platform_url: str) -> None:
    """Make sure the demo shows retries: the flaky user's calls fail a few times first."""
    rules = [
        {"path_prefix": "/v1/quota/charges", "user_id": "demo-flaky", "status": 503, "times": 2},
        {"path_prefix": "/v1/reports", "user_id": "demo-flaky", "status": 429, "retry_after": 1, "times": 1},
    ]
    request = urllib.request.Request(
        platform_url + "/_sim/faults",
        data=json.dumps({"rules": rules}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _wait_settled(stack: Stack, task_ids: list[str], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        stack.check_alive()
        out = stack.manage("task_states", *task_ids)
        states = json.loads(out)
        if all(state in TERMINAL for state in states.values()):
            counts: dict[str, int] = {}
            for state in states.values():
                counts[state] = counts.get(state, 0) + 1
            return counts
        if time.monotonic() > deadline:
            raise SystemExit(f"make run: demo tasks did not settle in {timeout:.0f}s: {states}")
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
