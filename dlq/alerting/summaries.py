"""What an alert event says, in the reader's language.

A measurement names its sentence by a code and gives the facts it needs
(counts, the pipeline, the limit); the event stores both
(``AlertEvent.summary_code``, ``summary_params``) and pages make the
sentence when they show it. The English sentence is stored too
(``AlertEvent.summary``): notifications send it, and a retried delivery must
send the same bytes whatever language the worker runs in.
"""

from __future__ import annotations

from typing import Any

from django.utils import translation
from django.utils.translation import gettext_lazy as _

SUMMARIES = {
    "open_items": _("%(count)s open DLQ items in %(where)s (limit %(limit)s)"),
    "growth": _("%(count)s new DLQ items in %(where)s within %(window)ss (limit %(limit)s)"),
    "oldest_age": _("the oldest open DLQ item in %(where)s is %(age)ss old (limit %(limit)ss)"),
    "oldest_age_none": _("no open DLQ items in %(where)s"),
    "new_failure_group": _("%(count)s failure group(s) not seen in the previous %(days)s days: %(groups)s"),
    "new_failure_group_none": _("no new failure group in %(where)s"),
    "sweeper_age": _("the last sweep finished %(age)ss ago (limit %(limit)ss)"),
    "sweeper_stalled": _("the last sweep finished %(age)ss ago (limit %(limit)ss): delivery is at risk"),
    "sweeper_never_ran": _("no sweeper has ever run: delivery of lost or retried tasks is at risk"),
    "approval_waiting": _(
        "%(count)s task(s) in %(where)s waiting for approval longer than %(limit)ss (the longest %(age)ss)"
    ),
    "approval_waiting_age": _(
        "the task waiting longest for approval in %(where)s has waited %(age)ss (limit %(limit)ss)"
    ),
    "approval_waiting_none": _("no task waits for approval in %(where)s"),
}
# Failure groups named in a summary; more are shown as "…".
SHOWN_GROUPS = 5


def _where(pipeline: str) -> str:
    return _("pipeline '%(pipeline)s'") % {"pipeline": pipeline} if pipeline else str(_("all pipelines"))


def summary_sentence(*, code: str, params: dict[str, Any]) -> str:
    """The sentence for ``code`` with ``params`` in the active language."""
    values = dict(params)
    values["where"] = _where(params.get("pipeline", ""))
    groups = list(params.get("groups", []))
    values["groups"] = ", ".join(groups[:SHOWN_GROUPS]) + (" …" if len(groups) > SHOWN_GROUPS else "")
    return str(SUMMARIES[code]) % values


def summary_sentence_english(*, code: str, params: dict[str, Any]) -> str:
    with translation.override("en"):
        return summary_sentence(code=code, params=params)
