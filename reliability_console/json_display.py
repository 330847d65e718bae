"""JSON as operators read it: indented, keys sorted, non-ASCII text as itself, never a Python ``repr``."""

from __future__ import annotations

import json
from typing import Any

INDENT = 2


def json_text(value: Any) -> str:
    """``value`` as indented JSON; a value JSON cannot hold (a date, a UUID) is shown as its text."""
    return json.dumps(value, indent=INDENT, sort_keys=True, ensure_ascii=False, default=str)
