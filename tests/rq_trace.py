"""A stand-in for an attacker's gadget: a callable that leaves a file behind if RQ ever calls it.

RQ calls a success callback as ``(job, connection, result)``, a failure
callback as ``(job, connection, type, value, traceback)`` and a stopped one as
``(job, connection)``: this one takes them all and touches
``<job.meta["trace_dir"]>/<job id>``.
"""

from __future__ import annotations

from pathlib import Path


def leave_trace(job, *args) -> None:
    Path(job.meta["trace_dir"], job.id).touch()
