"""``{{ value|pretty_json }}``: a dict or list as indented JSON (escaped by the template), for a ``<pre>``."""

from __future__ import annotations

from typing import Any

from django import template

from reliability_console.json_display import json_text

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    return json_text(value)
