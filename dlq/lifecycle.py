"""The task lifecycle (ARCHITECTURE.md section 4) drawn as an inline SVG, the current state highlighted.

Pure presentation: no database, no user data. Every text in the drawing is a
state label or a transition label from this module (translated, then escaped),
so the result may be marked safe and inlined in a page; it needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from django.utils.translation import gettext_lazy as _

from tasks.models import TaskState

BOX_WIDTH = 164
BOX_HEIGHT = 36
WIDTH = 960
HEIGHT = 394
LINE_HEIGHT = 13
# Everything is drawn this far down: the cancel of a queued task runs along the top margin, above the boxes.
TOP_MARGIN = 24

# Fill of the highlighted state; the others are outlined only, so the drawing reads in light and dark themes.
STATE_COLOURS = {
    TaskState.QUEUED: "#64748b",
    TaskState.RUNNING: "#2563eb",
    TaskState.RETRY_SCHEDULED: "#b45309",
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
    TaskState.FAILED: (400, 270),
    TaskState.COMPENSATING: (640, 270),
    TaskState.COMPENSATED: (860, 210),
    TaskState.COMPENSATION_FAILED: (860, 330),
    TaskState.CANCELLED: (640, 160),
}


@dataclass(frozen=True)
class Transition:
    source: str
    target: str
    label: tuple  # one lazily translated string per line
    path: str  # SVG path data, drawn from source to target
    label_at: tuple[int, int]
    anchor: str = "middle"


TRANSITIONS = (
    Transition(TaskState.QUEUED, TaskState.RUNNING, (_("claim"),), "M182,50 H316", (249, 42)),
    Transition(TaskState.RUNNING, TaskState.SUCCEEDED, (_("all steps done"),), "M482,50 H636", (559, 42)),
    Transition(
        TaskState.RUNNING,
        TaskState.RETRY_SCHEDULED,
        (_("transient error,"), _("attempts and"), _("deadline left")),
        "M350,68 L290,140",
        (305, 88),
        "end",
    ),
    Transition(TaskState.RETRY_SCHEDULED, TaskState.QUEUED, (_("due"),), "M200,142 L132,70", (155, 116), "end"),
    Transition(
        TaskState.RUNNING,
        TaskState.FAILED,
        (_("permanent error,"), _("attempts exhausted,"), _("deadline passed,"), _("crash loop")),
        "M400,68 V250",
        (412, 174),
        "start",
    ),
    Transition(
        TaskState.FAILED,
        TaskState.COMPENSATING,
        (_("pipeline policy"), _("or operator")),
        "M482,270 H556",
        (519, 228),
    ),
    Transition(TaskState.COMPENSATING, TaskState.COMPENSATED, (), "M722,262 L776,222", (0, 0)),
    Transition(TaskState.COMPENSATING, TaskState.COMPENSATION_FAILED, (), "M722,278 L776,318", (0, 0)),
    Transition(
        TaskState.FAILED,
        TaskState.QUEUED,
        (_("operator retry from DLQ"),),
        "M318,270 H100 V70",
        (209, 288),
    ),
    # A cancel (tasks.cancellation): at once when nothing runs, at the next step boundary when running. A task
    # with completed steps undoes them first (COMPENSATING), unless its pipeline parks cancels for an operator.
    Transition(TaskState.QUEUED, TaskState.CANCELLED, (_("cancel"),), "M100,32 V10 H900 V160 H724", (500, 4)),
    Transition(TaskState.RETRY_SCHEDULED, TaskState.CANCELLED, (_("cancel"),), "M332,160 H556", (480, 154)),
    Transition(
        TaskState.RUNNING,
        TaskState.CANCELLED,
        (_("cancel, at the next"), _("step boundary")),
        "M470,68 L578,142",
        (536, 92),
        "start",
    ),
    Transition(
        TaskState.COMPENSATING,
        TaskState.CANCELLED,
        (_("cancelled task's"), _("steps undone")),
        "M628,252 V180",
        (620, 196),
        "end",
    ),
    Transition(
        TaskState.CANCELLED,
        TaskState.COMPENSATING,
        (_("operator"), _("compensates")),
        "M652,178 V250",
        (660, 208),
        "start",
    ),
)


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
    line = (
        f'<path d="{transition.path}" fill="none" stroke="currentColor" stroke-width="{width}" '
        f'marker-end="url(#rc-lifecycle-arrow)"/>'
    )
    x, y = transition.label_at
    label = _text(x, y, transition.label, anchor=transition.anchor, css_class="transition-label")
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
    parts.extend(_transition(transition, current_state) for transition in TRANSITIONS)
    parts.extend(_state_box(state, state.value == current_state) for state in TaskState)
    parts.append("</g></svg>")
    return "".join(parts)
