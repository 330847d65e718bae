"""What a dead letter's failure reason says, in the reader's language.

An item stores its reason as a code (``reason_code``, a ``FailureReason``) and
the facts the sentence needs (``reason_params``: step, error code, message,
attempts, crashes), and the sentence is made when a page shows it, so an
operator reading the console in Chinese reads it in Chinese. The English
sentence is stored too (``reason``), for the readers that only know that
column: a previous release after a rollback, exports, SQL by hand, items
written before ``reason_params`` existed.
"""

from __future__ import annotations

from typing import Any

from django.utils import translation
from django.utils.translation import gettext_lazy as _

# From its own module, not the package: the package's DeadLetter words its reason with these texts.
from tasks.models.task import FailureReason

REASON_MESSAGES = {
    FailureReason.PERMANENT_ERROR: _("Step '%(step)s' failed with a permanent error (%(code)s): %(message)s"),
    FailureReason.ATTEMPTS_EXHAUSTED: _(
        "Step '%(step)s' kept failing with transient errors; all %(attempts)s attempts used. "
        "Last error (%(code)s): %(message)s"
    ),
    FailureReason.DEADLINE_EXCEEDED: _(
        "The task's deadline passed before step '%(step)s' could run again. Last error (%(code)s): %(message)s"
    ),
    FailureReason.CRASH_LOOP: _(
        "Workers died %(crashes)s times while running step '%(step)s'; stopped to avoid a crash loop."
    ),
    FailureReason.COMPENSATION_FAILED: _("Compensation could not finish: %(message)s"),
    FailureReason.PIPELINE_CHANGED: _(
        "The pipeline changed since the task started: %(message)s. Retry it from start or compensate it."
    ),
    FailureReason.CANCELLED: _(
        "The task was cancelled and its completed steps still need undoing: %(message)s. "
        "Compensate it, or undo them by hand and close it."
    ),
}
OTHER_REASON = _("Step '%(step)s' failed (%(code)s): %(message)s")
PARAMS = ("step", "code", "message", "attempts", "crashes")


def reason_params(*, step: str, code: str, message: str, attempts: int, crashes: int = 0) -> dict[str, Any]:
    """The facts a reason's sentence needs, as stored in ``DeadLetter.reason_params`` (JSON)."""
    return {"step": step, "code": code or "-", "message": message or "-", "attempts": attempts, "crashes": crashes}


def reason_sentence(*, reason: str, params: dict[str, Any]) -> str:
    """The sentence for ``reason`` (a ``FailureReason`` code) in the active language."""
    values = {name: params.get(name, "-") for name in PARAMS}
    return str(REASON_MESSAGES.get(reason, OTHER_REASON)) % values


def reason_sentence_english(*, reason: str, params: dict[str, Any]) -> str:
    with translation.override("en"):
        return reason_sentence(reason=reason, params=params)
