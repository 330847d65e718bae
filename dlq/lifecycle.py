"""The task lifecycle (ARCHITECTURE.md section 4) drawn as an inline SVG, the current state highlighted.

Pure presentation: no database, no user data. Every text in the drawing is a
state label or a transition label from this module (translated, then escaped),
so the result may be marked safe and inlined in a page; it needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from django.utils.translation import gettext_lazy as _
from django_fsm import ANY_OTHER_STATE, ANY_STATE, State

from tasks.models import Task, TaskState

BOX_WIDTH = 164
BOX_HEIGHT = 36
WIDTH = 960
HEIGHT = 414
LINE_HEIGHT = 13
# Everything is drawn this far down: the cancel of a queued task runs along the top margin, above the boxes.
TOP_MARGIN = 24

# Fill of the highlighted state; the others are outlined only, so the drawing reads in light and dark themes.
STATE_COLOURS = {
    TaskState.QUEUED: "#64748b",
    TaskState.RUNNING: "#2563eb",
    TaskState.RETRY_SCHEDULED: "#b45309",
    TaskState.WAITING: "#0369a1",
    TaskState.SUCCEEDED: "#15803d",
    TaskState.FAILED: "#b91c1c",
    TaskState.COMPENSATING: "#7c3aed",
    TaskState.COMPENSATED: "#0f766e",
    TaskState.COMPENSATION_FAILED: "#7f1d1d",
    TaskState.CANCELLED: "#475569",
}

# Centre of each state's box.
POSITIONS = {
    TaskState.QUEUED: (100, 50),
    TaskState.RUNNING: (400, 50),
    TaskState.SUCCEEDED: (720, 50),
    TaskState.RETRY_SCHEDULED: (250, 160),
    TaskState.WAITING: (250, 330),
    TaskState.FAILED: (400, 270),
    TaskState.COMPENSATING: (640, 270),
    TaskState.COMPENSATED: (860, 210),
    TaskState.COMPENSATION_FAILED: (860, 330),
    TaskState.CANCELLED: (640, 160),
}


@dataclass(frozen=True)
class Route:
    """Where the arrow of one change of state runs, and what it says."""

    label: tuple  # one lazily translated string per line
    path: str  # SVG path data, drawn from source to target
    label_at: tuple[int, int]
    anchor: str = "middle"


# How each change of state is drawn. Which changes there are is the state machine's (``state_changes``): a route
# here for a change it does not have is never drawn, and a change without one is drawn as a straight arrow.
ROUTES = {
    (TaskState.QUEUED, TaskState.RUNNING): Route((_("claim"),), "M182,56 H316", (249, 70)),
    # Held at a step boundary (paused, a limit), or its lease expired: waiting again, no attempt used.
    (TaskState.RUNNING, TaskState.QUEUED): Route((_("held back or worker lost"),), "M318,40 H184", (250, 30)),
    (TaskState.RUNNING, TaskState.SUCCEEDED): Route((_("all steps done"),), "M482,50 H636", (559, 42)),
    (TaskState.RUNNING, TaskState.RETRY_SCHEDULED): Route(
        (_("transient error,"), _("attempts and"), _("deadline left")), "M350,68 L290,140", (305, 88), "end"
    ),
    (TaskState.RETRY_SCHEDULED, TaskState.QUEUED): Route((_("due"),), "M200,142 L132,70", (155, 116), "end"),
    (TaskState.RUNNING, TaskState.FAILED): Route(
        (_("permanent error,"), _("attempts exhausted,"), _("deadline passed,"), _("crash loop")),
        "M400,68 V250",
        (412, 174),
        "start",
    ),
    (TaskState.FAILED, TaskState.COMPENSATING): Route(
        (_("pipeline policy"), _("or operator")), "M482,270 H556", (519, 250)
    ),
    # At a sleep or wait step the task waits without a worker, between the retry's box and the failure's.
    (TaskState.RUNNING, TaskState.WAITING): Route(
        (_("sleep or"), _("wait step")), "M340,68 V222 H300 V312", (306, 234), "start"
    ),
    # A task submitted to start later, asleep or waiting for a signal has no job: the sweeper wakes it at its time,
    # a signal's sender when the signal comes.
    (TaskState.WAITING, TaskState.QUEUED): Route(
        (_("its time or"), _("signal came")), "M168,330 H40 V68", (46, 306), "start"
    ),
    (TaskState.WAITING, TaskState.CANCELLED): Route((_("cancel"),), "M332,322 H540 V170 H556", (436, 316)),
    (TaskState.WAITING, TaskState.COMPENSATING): Route((), "M332,340 H640 V290", (0, 0)),
    (TaskState.COMPENSATING, TaskState.COMPENSATED): Route((), "M722,262 L776,222", (0, 0)),
    (TaskState.COMPENSATING, TaskState.COMPENSATION_FAILED): Route((), "M722,278 L776,318", (0, 0)),
    # An operator's retries from the DLQ share one line into QUEUED.
    (TaskState.FAILED, TaskState.QUEUED): Route((_("operator retry from DLQ"),), "M318,270 H100 V70", (209, 288)),
    (TaskState.COMPENSATION_FAILED, TaskState.QUEUED): Route(
        (_("operator retry from DLQ"),), "M860,348 V376 H100 V70", (480, 370)
    ),
    (TaskState.COMPENSATED, TaskState.QUEUED): Route((), "M942,210 H952 V376 H100 V70", (0, 0)),
    (TaskState.COMPENSATION_FAILED, TaskState.COMPENSATING): Route(
        (_("operator"), _("retries")), "M778,338 H700 V290", (692, 322), "end"
    ),
    # Parked before its first step: its pipeline is unknown or changed, or its deadline passed.
    (TaskState.QUEUED, TaskState.FAILED): Route((_("no step can run"),), "M114,68 V258 H316", (122, 250), "start"),
    # A cancel (tasks.lifecycle.cancellation): at once when nothing runs, at the next step boundary when running. A task
    # with completed steps undoes them first (COMPENSATING), unless its pipeline parks cancels for an operator.
    (TaskState.QUEUED, TaskState.CANCELLED): Route((_("cancel"),), "M100,32 V10 H900 V160 H724", (500, 4)),
    (TaskState.RETRY_SCHEDULED, TaskState.CANCELLED): Route((_("cancel"),), "M332,160 H556", (480, 154)),
    (TaskState.RUNNING, TaskState.CANCELLED): Route(
        (_("cancel, at the next"), _("step boundary")), "M470,68 L578,142", (536, 92), "start"
    ),
    # A cancel with completed steps to undo: the three share one line into COMPENSATING.
    (TaskState.QUEUED, TaskState.COMPENSATING): Route(
        (_("cancel, with"), _("steps to undo")), "M114,68 V236 H600 V250", (122, 217), "start"
    ),
    (TaskState.RETRY_SCHEDULED, TaskState.COMPENSATING): Route((), "M250,178 V236 H600 V250", (0, 0)),
    (TaskState.RUNNING, TaskState.COMPENSATING): Route((), "M370,68 V236 H600 V250", (0, 0)),
    (TaskState.COMPENSATING, TaskState.CANCELLED): Route(
        (_("cancelled task's"), _("steps undone")), "M628,252 V180", (620, 196), "end"
    ),
    (TaskState.CANCELLED, TaskState.COMPENSATING): Route(
        (_("operator"), _("compensates")), "M652,178 V250", (660, 208), "start"
    ),
}


@dataclass(frozen=True)
class Transition:
    """One arrow of the drawing: a change of state and where it runs."""

    source: TaskState
    target: TaskState
    route: Route


def state_changes() -> set[tuple[str, str]]:
    """Every change of state the FSM on ``Task`` allows, as (source, target).

    Read from django-fsm-2's own introspection, so a transition added to the
    model is drawn without a word changed here. A transition that keeps the
    state (``advance``, a lease taken over) is no change of state.
    """
    states = [state.value for state in TaskState]
    changes = set()
    for transition in Task().get_all_state_transitions():
        for target in _targets(transition):
            if transition.source == ANY_STATE:
                sources = states
            elif transition.source == ANY_OTHER_STATE:
                sources = [state for state in states if state != target]
            else:
                sources = [str(transition.source)]
            changes.update((source, target) for source in sources if source != target)
    return changes


def _targets(transition) -> list[str]:
    target = transition.target
    if target is None:  # django-fsm-2: the state stays as it is
        return []
    if isinstance(target, State):  # RETURN_VALUE / GET_STATE: one of the states it allows
        if not target.allowed_states:
            raise ValueError(f"transition {transition.name!r}: its target states are not declared")
        return [str(state) for state in target.allowed_states]
    return [str(target)]


def drawn_transitions() -> list[Transition]:
    """The arrows of the drawing: every change of state, in the order of ``ROUTES`` (the others after them)."""
    order = {change: index for index, change in enumerate(ROUTES)}
    arrows = []
    for source, target in sorted(state_changes(), key=lambda change: (order.get(change, len(order)), change)):
        source_state, target_state = _state(source), _state(target)
        route = ROUTES.get((source_state, target_state)) or _straight_route(source_state, target_state)
        arrows.append(Transition(source_state, target_state, route))
    return arrows


def _state(value: str) -> TaskState:
    state = TaskState(value)
    if state not in POSITIONS:
        raise LookupError(f"the lifecycle drawing has no place for state {value!r}: add it to dlq.lifecycle.POSITIONS")
    return state


def _straight_route(source: TaskState, target: TaskState) -> Route:
    """From box edge to box edge along the line between their centres, unlabelled."""
    (x1, y1), (x2, y2) = POSITIONS[source], POSITIONS[target]
    dx, dy = x2 - x1, y2 - y1
    # The part of the way from a centre to its box's edge (the boxes are alike, so the same at both ends).
    edge = min(BOX_WIDTH / 2 / abs(dx) if dx else 1.0, BOX_HEIGHT / 2 / abs(dy) if dy else 1.0)
    start = (round(x1 + dx * edge), round(y1 + dy * edge))
    end = (round(x2 - dx * edge), round(y2 - dy * edge))
    return Route((), f"M{start[0]},{start[1]} L{end[0]},{end[1]}", (0, 0))


def _text(x: int, y: int, lines, *, anchor: str = "middle", css_class: str = "") -> str:
    if not lines:
        return ""
    class_attr = f' class="{css_class}"' if css_class else ""
    spans = "".join(
        f'<tspan x="{x}" dy="{0 if index == 0 else LINE_HEIGHT}">{escape(str(line))}</tspan>'
        for index, line in enumerate(lines)
    )
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}" fill="currentColor" font-size="11"{class_attr}>{spans}</text>'


def _state_box(state: TaskState, current: bool) -> str:
    x, y = POSITIONS[state]
    left, top = x - BOX_WIDTH // 2, y - BOX_HEIGHT // 2
    colour = STATE_COLOURS[state]
    if current:
        rect = (
            f'<rect x="{left}" y="{top}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="8" '
            f'fill="{colour}" stroke="{colour}" stroke-width="3"/>'
        )
        label = f'<text x="{x}" y="{y + 5}" text-anchor="middle" fill="#ffffff" font-weight="bold">'
    else:
        rect = (
            f'<rect x="{left}" y="{top}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="8" '
            f'fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
        label = f'<text x="{x}" y="{y + 5}" text-anchor="middle" fill="currentColor">'
    css_class = "state current" if current else "state"
    aria = ' aria-current="step"' if current else ""
    return (
        f'<g class="{css_class}" data-state={quoteattr(state.value)}{aria}>'
        f"<title>{escape(str(state.label))}</title>{rect}{label}{escape(str(state.label))}</text></g>"
    )


def _transition(transition: Transition, current_state: str) -> str:
    leaves_current = transition.source == current_state
    width = "2" if leaves_current else "1.2"
    route = transition.route
    line = (
        f'<path d="{route.path}" fill="none" stroke="currentColor" stroke-width="{width}" '
        f'marker-end="url(#rc-lifecycle-arrow)"/>'
    )
    x, y = route.label_at
    label = _text(x, y, route.label, anchor=route.anchor, css_class="transition-label")
    return (
        f'<g class="transition" data-source={quoteattr(str(transition.source.value))} '
        f"data-target={quoteattr(str(transition.target.value))}>{line}{label}</g>"
    )


def lifecycle_svg(current_state: str) -> str:
    """The lifecycle diagram as a standalone ``<svg>`` element with ``current_state`` highlighted.

    An unknown state highlights nothing. The result holds no user data and is
    escaped throughout, so it is safe to ``mark_safe``.
    """
    title = escape(str(_("Task lifecycle")))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rc-lifecycle" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" role="img" aria-label={quoteattr(str(_("Task lifecycle")))} '
        f'font-family="sans-serif" font-size="12">',
        f"<title>{title}</title>",
        "<defs>"
        '<marker id="rc-lifecycle-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        'markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker>'
        "</defs>",
    ]
    parts.append(f'<g transform="translate(0,{TOP_MARGIN})">')
    parts.extend(_transition(transition, current_state) for transition in drawn_transitions())
    parts.extend(_state_box(_state(state), state.value == current_state) for state in TaskState)
    parts.append("</g></svg>")
    return "".join(parts)
