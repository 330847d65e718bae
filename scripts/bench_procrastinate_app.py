"""The Procrastinate baseline's app (``scripts/bench_procrastinate.py``): one no-op task. Runs in the baseline's
own venv (Procrastinate and psycopg 3), never in the project's."""

from __future__ import annotations

import os

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PROCRASTINATE_DSN"]))

HELD_QUEUE = "held"


@app.task(name="noop", queue=HELD_QUEUE)
def noop() -> None:
    """Nothing at all, as the bare RQ baseline's job."""


def defer(count: int) -> None:
    """Defer ``count`` no-op jobs onto the held queue (no worker listens to it), 1,000 per statement."""
    with app.open():
        for first in range(0, count, 1000):
            noop.batch_defer(*({} for _ in range(first, min(count, first + 1000))))
