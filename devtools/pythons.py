"""The Python interpreters of these machines, for tools that build a venv of another version.

Django 6 needs Python 3.12 or newer; pyenv here has 3.11 (the default), 3.12 and 3.13. Used by
``scripts/ci_matrix.py`` and by the acceptance tests that build a fresh venv of a given Python.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path


def python_for(version: str) -> str:
    """An interpreter of ``version`` (major.minor): pyenv's newest patch release of it, else PATH's."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    builds = glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}")
    patch = re.compile(rf"/versions/{re.escape(version)}\.(\d+)/")
    released = sorted((int(m.group(1)), path) for path in builds if (m := patch.search(path)))
    if released:
        return released[-1][1]
    found = shutil.which(f"python{version}")
    if found and _runs(found):
        return found
    raise SystemExit(f"no Python {version} found (pyenv versions, or python{version} on PATH)")


def _runs(python: str) -> bool:
    # A pyenv shim exists for every installed version but fails unless that version is selected.
    return subprocess.run([python, "-c", ""], capture_output=True, check=False).returncode == 0
