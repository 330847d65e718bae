"""The CI subset on another supported Django and database driver, each in a venv of its own outside `.venv`.

    python3 scripts/ci_matrix.py dj61-pg3                 # the venv (cached), unit, integration, one acceptance
    python3 scripts/ci_matrix.py dj52-pg3 --subset unit   # a named subset
    python3 scripts/ci_matrix.py dj61-pg2 -- -x -k lease  # arguments after -- go to pytest
    python3 scripts/ci_matrix.py --list

The main suite (`make test`) runs in `.venv`: Python 3.11, Django 5.2, psycopg2. Each combination here
names a Python, a Django release and a driver; its venv lives in `$RC_CI_VENVS/<name>` (default
`var/ci-venvs/<name>`) and is built again only when pyproject.toml or the combination changed. The project
is installed editable with `[dev,local,<driver>]` and the Django release forced. A psycopg2 combination
checks that psycopg 3 is *not* importable there: Django picks psycopg 3 whenever it imports, so a stray
install would silently test the other driver. Tests run with the venv's own python from the checkout
(worker subprocesses start with `sys.executable`, so they run there too), against `DATABASE_URL`
(default: the machine's PostgreSQL, database `rc_ci_<name>`). Durations are printed: the venv, each step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.pythons import python_for  # noqa: E402


@dataclass(frozen=True)
class Combination:
    python: str  # major.minor
    django: str  # a pip requirement of Django
    driver: str  # the project's extra: psycopg (3) or psycopg2


# Django 6.x needs Python 3.12 or newer; 5.2 LTS runs on 3.11 to 3.13.
COMBINATIONS = {
    "dj52-pg3": Combination("3.11", "Django>=5.2,<5.3", "psycopg"),
    "dj60-pg3": Combination("3.13", "Django>=6.0,<6.1", "psycopg"),
    "dj61-pg3": Combination("3.12", "Django>=6.1,<6.2", "psycopg"),
    "dj61-pg2": Combination("3.12", "Django>=6.1,<6.2", "psycopg2"),
}
# `make test-fast`'s selection (the Makefile's TEST_FAST_MARKERS): unit and integration tests that start no
# process, drive no browser and build no venv.
FAST_MARKERS = "not acceptance and not processes and not browser and not slow"
# Each subset is one pytest run (paths, then options), timed on its own.
SUBSETS = {
    "unit": ["tests/unit"],
    "integration": ["tests/integration"],
    "fast": ["tests/unit", "tests/integration", "-m", FAST_MARKERS],
    # The engine's promises end to end: real workers, the simulator, the sweeper, crashes and compensation.
    "acceptance": ["tests/acceptance/test_report_pipeline.py"],
    # Django's Tasks framework on real workers (django.tasks on Django 6, the backport on 5.2).
    "django-tasks": ["tests/acceptance/test_django_tasks_live.py"],
    "pgbouncer": ["tests/acceptance/test_pgbouncer.py"],
    # The two short fault campaigns; chaos-production is the second alone: every connection through PgBouncer,
    # Redis under Sentinel with a failover, PostgreSQL restarted, and every fault of the first.
    "chaos": ["tests/acceptance/test_chaos_campaign.py"],
    "chaos-production": ["tests/acceptance/test_chaos_campaign.py", "-k", "pgbouncer"],
    "embedded": ["tests/acceptance/test_embedded_project.py"],
}
DEFAULT_SUBSET = "unit,integration,acceptance"
STAMP = ".rc-ci-installed"


def venv_ready(name: str, combination: Combination, directory: Path) -> Path:
    """The venv's python, with the project installed as ``combination`` says; built only when out of date."""
    python = directory / "bin" / "python"
    wanted = _install_key(combination)
    stamp = directory / STAMP
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    _run([python_for(combination.python), "-m", "venv", str(directory)], f"{name}: creating the venv")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "-e", f"{ROOT}[dev,local,{combination.driver}]", combination.django], f"{name}: installing")
    stamp.write_text(wanted)
    return python


def _install_key(combination: Combination) -> str:
    pyproject = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    return json.dumps({"combination": combination.__dict__, "pyproject": pyproject}, sort_keys=True)


# Run in the venv: which versions it holds, and the driver Django itself will use there.
VERSIONS_PROBE = """
import json, platform, django
from django.db.backends.postgresql.psycopg_any import is_psycopg3
if is_psycopg3:
    import psycopg as driver
else:
    import psycopg2 as driver
print(json.dumps({"python": platform.python_version(), "django": django.get_version(),
                  "driver": driver.__name__, "driver_version": driver.__version__.split()[0]}))
"""


def versions(python: Path) -> dict:
    done = subprocess.run([str(python), "-c", VERSIONS_PROBE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ci_matrix: the venv does not import Django and a driver:\n{done.stderr}")
    return json.loads(done.stdout)


def _run(argv: list[str], what: str) -> None:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ci_matrix: {what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    print(f"{what}: {time.monotonic() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="-- ARGS: passed to pytest")
    parser.add_argument("name", nargs="?", choices=sorted(COMBINATIONS), help="the combination")
    parser.add_argument("--subset", default=DEFAULT_SUBSET, help=f"comma-separated, of {', '.join(SUBSETS)}")
    parser.add_argument("--list", action="store_true", help="list the combinations and subsets, then exit")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after "--" is pytest's, options included (argparse would read them as ours).
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.list:
        for name, combination in COMBINATIONS.items():
            print(f"{name}: Python {combination.python}, {combination.django}, [{combination.driver}]")
        for name, arguments in SUBSETS.items():
            print(f"subset {name}: {' '.join(arguments)}")
        return 0
    if args.name is None:
        parser.error("name a combination (or --list)")
    subsets = [part.strip() for part in args.subset.split(",") if part.strip()]
    unknown = [part for part in subsets if part not in SUBSETS]
    if unknown or not subsets:
        parser.error(f"--subset: unknown {', '.join(unknown) or '(empty)'}; known: {', '.join(SUBSETS)}")

    combination = COMBINATIONS[args.name]
    started = time.monotonic()
    cache = Path(os.environ.get("RC_CI_VENVS") or ROOT / "var" / "ci-venvs")
    python = venv_ready(args.name, combination, cache / args.name)
    found = versions(python)
    if found["driver"] != ("psycopg" if combination.driver == "psycopg" else "psycopg2"):
        raise SystemExit(f"ci_matrix: {args.name} wants [{combination.driver}] but Django there uses {found['driver']}")
    print(
        f"{args.name}: Python {found['python']}, Django {found['django']}, {found['driver']} "
        f"{found['driver_version']} (venv {cache / args.name}, ready in {time.monotonic() - started:.1f} s)",
        flush=True,
    )

    env = dict(os.environ)
    env.setdefault("DATABASE_URL", f"postgresql://postgres@127.0.0.1:5432/rc_ci_{args.name.replace('-', '_')}")
    env.pop("VIRTUAL_ENV", None)
    worst = 0
    for part in subsets:
        command = [str(python), "-m", "pytest", *SUBSETS[part], "-q", "-p", "no:cacheprovider", *pytest_args]
        subset_started = time.monotonic()
        exit_code = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
        print(f"{args.name} [{part}]: pytest exit {exit_code} in {time.monotonic() - subset_started:.1f} s", flush=True)
        worst = worst or exit_code
    print(f"{args.name}: {', '.join(subsets)} in {time.monotonic() - started:.1f} s with the venv", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
