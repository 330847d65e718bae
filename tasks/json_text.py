"""What PostgreSQL's jsonb cannot store: a NUL character, or an unpaired UTF-16 surrogate.

Both arrive as JSON escapes (``\\u0000``, ``\\ud800``) and are valid JSON, so
the parser accepts them; PostgreSQL refuses them at the write. The API refuses
them as bad input and the runner as the step's own error, each before a write.
"""

from __future__ import annotations

import json
import re
from typing import Any

# "\u0000" in JSON text, not preceded by an escaping backslash.
ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Any escaped surrogate (paired or not): only then is the slower exact check needed.
ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def unstorable_json(text: str, value: Any) -> str | None:
    """Name what in ``value`` (decoded from the JSON ``text``) jsonb cannot store, or ``None``."""
    if ESCAPED_NUL.search(text):
        return "a NUL character"
    if ESCAPED_SURROGATE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return "an unpaired surrogate"
    return None
