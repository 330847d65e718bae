"""The DBOS baseline's process (``scripts/bench_dbos.py``): a workflow of 10 steps that only return, called in a
loop. Runs in the baseline's own venv (DBOS, SQLAlchemy, psycopg 3), never in the project's.

``setup URL``: create DBOS's system tables in the database and exit (one process, so that the measured ones
do not race to create them). ``run URL WORKFLOWS EXECUTOR``: launch DBOS as executor ``EXECUTOR``, run 20
workflows to warm up, print ``ready``, wait for a line on stdin, run ``WORKFLOWS`` workflows, print ``span START
END STEPS`` (``time.monotonic()``, one clock for every process of the machine; the steps it ran).
"""

from __future__ import annotations

import sys
import time

from dbos import DBOS

STEPS = 10
WARM_UP = 20


def launch(url: str, executor: str) -> None:
    # Each process its own executor: at launch DBOS recovers its executor's unfinished workflows, and two
    # processes sharing one would take over each other's.
    DBOS(config={"name": "rc-bench", "system_database_url": url, "executor_id": executor, "log_level": "WARNING"})


@DBOS.step()
def step(index: int) -> None:
    """Nothing at all, as the engine's ``bench_noop_10`` steps."""


@DBOS.workflow()
def workflow() -> None:
    for index in range(STEPS):
        step(index)


def main(argv: list[str]) -> None:
    if argv[0] == "setup":
        launch(argv[1], "setup")
        DBOS.launch()
        DBOS.destroy()
        return
    _, url, workflows, executor = argv
    launch(url, executor)
    DBOS.launch()
    for _ in range(WARM_UP):
        workflow()
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    for _ in range(int(workflows)):
        workflow()
    print(f"span {started} {time.monotonic()} {int(workflows) * STEPS}", flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
