"""The Pipelines page: every registered pipeline's queue, limits, pause and held tasks; its confirmation pages.

The page is read-only for every role (``tasks.view_task``). A supervisor
also gets its actions (``tasks.pause_pipeline``: pause, resume;
``tasks.limit_pipeline``: set, reset the limits), each a confirmation page on
GET that acts on POST through ``dlq.live_actions.pipeline_act`` (one engine
service, audited in its transaction), then a message and a redirect
(``dlq.admin.common.action_page``, the frame of every such page). A POST
without the permission is a 403 and an audit entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache

from dlq.admin.common import action_page, client_ip, deny
from dlq.live_actions import PIPELINE_ACTIONS, PipelineAction, limits_form_parse, pipeline_act
from tasks.models import PipelineControl, TaskHold
from tasks.selectors import PipelineState, control_gate, pipeline_state, pipeline_states

# The form's fields that may be shown again after a form error (never more than a field may hold).
LIMIT_FIELD_LENGTH = 20
DONE_MESSAGES = {
    "pause": _("Pipeline %(pipeline)s paused: no step of it starts until it is resumed."),
    "resume": _("Pipeline %(pipeline)s resumed: its held tasks start again."),
    "set_limits": _("Limits of pipeline %(pipeline)s set: %(limits)s."),
    "reset_limits": _("Pipeline %(pipeline)s is back to the limits its code declares: %(limits)s."),
}


@dataclass(frozen=True)
class HeldCount:
    hold: str
    label: str
    count: int


@dataclass(frozen=True)
class PipelineRow:
    """A pipeline as the page shows it, with the actions the reader may take on it now."""

    state: PipelineState
    held: list[HeldCount]  # per hold reason, the reasons with tasks only
    actions: list[tuple[str, str, str]]  # (name, label, confirmation page URL)

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def paused(self) -> bool:
        return self.state.gate.paused

    @property
    def held_total(self) -> int:
        return sum(row.count for row in self.held)

    @property
    def concurrency_overridden(self) -> bool:
        return bool(self.state.control and self.state.control.concurrency_overridden)

    @property
    def rate_overridden(self) -> bool:
        return bool(self.state.control and self.state.control.rate_overridden)


def held_counts_labelled(held: dict[str, int]) -> list[HeldCount]:
    """Held tasks per hold reason, in the reasons' order, labelled in the reader's language."""
    return [
        HeldCount(hold=hold.value, label=str(hold.label), count=held[hold.value])
        for hold in TaskHold
        if hold != TaskHold.NONE and held.get(hold.value)
    ]


def _row(state: PipelineState, user) -> PipelineRow:
    actions = [
        (name, str(spec.label), reverse("pipeline_act", args=[state.name, name]))
        for name, spec in PIPELINE_ACTIONS.items()
        if user.has_perm(spec.permission) and spec.allows(state)
    ]
    return PipelineRow(state=state, held=held_counts_labelled(state.held), actions=actions)


@staff_member_required
@permission_required("tasks.view_task", raise_exception=True)
@never_cache
def pipelines(request: HttpRequest) -> HttpResponse:
    """Every registered pipeline: queue, declared and effective limits, pause, running and held tasks."""
    context = {
        **admin.site.each_context(request),
        "title": _("Pipelines"),
        "pipelines": [_row(state, request.user) for state in pipeline_states()],
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/pipelines.html", context)


@staff_member_required
@never_cache
def pipeline_action_page(request: HttpRequest, pipeline: str, action: str) -> HttpResponse:
    """GET: what the action does and its form. POST: act, then message and redirect to the Pipelines page."""
    spec = PIPELINE_ACTIONS.get(action)
    if spec is None:
        raise Http404("unknown action")
    if not request.user.has_perm(spec.permission):
        deny(request, action=spec.audit_action, target_type="pipeline", target_id=pipeline)
    state = pipeline_state(pipeline)
    if state is None:
        raise Http404("no such pipeline")
    page_url = f"{reverse('pipelines')}#pipeline-{state.name}"
    return action_page(
        request,
        lambda: _act(request, spec, state),
        template="admin/pipeline_confirm.html",
        title=_("%(action)s: pipeline %(pipeline)s") % {"action": spec.label, "pipeline": state.name},
        page_context=lambda: {
            "spec": spec,
            "row": _row(state, request.user),
            "available": spec.allows(state),
            "form": {key: request.POST.get(key, "")[:LIMIT_FIELD_LENGTH] for key in ("max_concurrency", "rate_limit")},
            "no_limit": {key: bool(request.POST.get(key)) for key in ("no_concurrency_limit", "no_rate_limit")},
        },
        done_url=page_url,
        done_message=lambda control: _done_message(spec, control),
        return_url=page_url,
    )


def _act(request: HttpRequest, spec: PipelineAction, state: PipelineState) -> PipelineControl:
    form = request.POST
    limits = None
    if spec.name == "set_limits":
        limits = limits_form_parse(
            max_concurrency=form.get("max_concurrency", ""),
            no_concurrency_limit=bool(form.get("no_concurrency_limit")),
            rate_limit=form.get("rate_limit", ""),
            no_rate_limit=bool(form.get("no_rate_limit")),
        )
    return pipeline_act(
        pipeline=state.name,
        action=spec.name,
        actor=request.user,
        reason=form.get("reason", ""),
        limits=limits,
        client_ip=client_ip(request),
    )


def _done_message(spec: PipelineAction, control: PipelineControl) -> str:
    gate = control_gate(control)
    limits = _("max concurrency %(concurrency)s, rate limit %(rate)s") % {
        "concurrency": gate.max_concurrency or _("none"),
        "rate": gate.rate or _("none"),
    }
    return DONE_MESSAGES[spec.name] % {"pipeline": control.pipeline, "limits": limits}
