"""Search attributes: business keys of a task (an order id, a customer id) an operator or a client finds it by.

A pipeline declares their names (``Pipeline(search_attributes=("order_id", "customer_id"))``); each task's
values are read from its input when it is submitted, and a step may set or change them
(``ctx.set_attributes``), written with its checkpoint. They are stored in the task's ``attributes`` column
(jsonb, a GIN index with ``jsonb_path_ops``): one column of the row the submission inserts anyway, so a
submission or a step that sets none costs no statement and no row more, and a search is a containment
(``attributes @> '{"order_id": "A1001"}'``) the index answers, composed with any other filter of the list.
Values are kept as text: a number is stored as its decimal text, so ``1001`` and ``"1001"`` are one value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tasks.exceptions import ConfigurationError
from tasks.redaction import redact

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")
MAX_ATTRIBUTES = 10
MAX_VALUE_LENGTH = 200


class AttributeRefused(ValueError):
    """A value an attribute cannot take (its ``code`` says why: ``invalid_attribute``, ``unknown_attribute``)."""

    def __init__(self, message: str, *, code: str, name: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


def attribute_names_checked(pipeline: str, names: Iterable[str]) -> tuple[str, ...]:
    """A pipeline's declared attribute names, or the ``ConfigurationError`` naming the wrong one."""
    if isinstance(names, str):
        raise ConfigurationError(f"pipeline {pipeline!r}: search_attributes is a tuple of names, not one string")
    checked = tuple(names)
    for name in checked:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ConfigurationError(
                f"pipeline {pipeline!r}: search attribute {name!r} must match {NAME_PATTERN.pattern} "
                "(lower-case letters, digits and underscores, at most 63)"
            )
    if len(set(checked)) != len(checked):
        raise ConfigurationError(f"pipeline {pipeline!r}: search attributes are named twice: {checked!r}")
    if len(checked) > MAX_ATTRIBUTES:
        raise ConfigurationError(f"pipeline {pipeline!r}: at most {MAX_ATTRIBUTES} search attributes")
    return checked


def attribute_value(name: str, value: Any) -> str:
    """``value`` as the attribute ``name`` stores it (text), or ``AttributeRefused``."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise AttributeRefused(
            f"search attribute {name!r} is a string or a number, not {type(value).__name__}",
            code="invalid_attribute",
            name=name,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise AttributeRefused(f"search attribute {name!r} is not a finite number", code="invalid_attribute", name=name)
    text = value if isinstance(value, str) else str(value)
    if not text or len(text) > MAX_VALUE_LENGTH or "\x00" in text:
        raise AttributeRefused(
            f"search attribute {name!r} is 1 to {MAX_VALUE_LENGTH} characters (no NUL)",
            code="invalid_attribute",
            name=name,
        )
    if redact({name: text}) != {name: text}:
        # Attributes are shown and searched in clear: a name or value the redaction rules call a secret is not one.
        raise AttributeRefused(
            f"search attribute {name!r} would hold a secret (the redaction rules say so): it is not kept",
            code="secret_attribute",
            name=name,
        )
    return text


def attributes_from_input(names: tuple[str, ...], data: Any) -> dict[str, str] | None:
    """The declared attributes an input gives (a missing or null one is absent); None when it gives none."""
    if not names or not isinstance(data, Mapping):
        return None
    found = {name: attribute_value(name, data[name]) for name in names if data.get(name) is not None}
    return found or None


def attributes_changed(
    names: tuple[str, ...], current: Mapping[str, str] | None, changes: Mapping[str, Any]
) -> dict[str, str] | None:
    """``current`` with ``changes`` (a value of None removes the attribute); ``AttributeRefused`` for a name the
    pipeline did not declare or a bad value."""
    merged = dict(current or {})
    for name, value in changes.items():
        if name not in names:
            raise AttributeRefused(
                f"search attribute {name!r} is not declared by the pipeline (it declares {', '.join(names) or 'none'})",
                code="unknown_attribute",
                name=name,
            )
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = attribute_value(name, value)
    return merged or None


def attribute_filter_checked(name: str, value: str) -> tuple[str, str]:
    """A search by attribute (``name``, ``value``), or ``AttributeRefused`` naming what is wrong with it."""
    if not NAME_PATTERN.fullmatch(name or ""):
        raise AttributeRefused(
            f"attribute.{name} is not an attribute name ({NAME_PATTERN.pattern})", code="invalid_filter", name=name
        )
    if not value or len(value) > MAX_VALUE_LENGTH:
        raise AttributeRefused(
            f"attribute.{name} takes a value of 1 to {MAX_VALUE_LENGTH} characters", code="invalid_filter", name=name
        )
    return name, value
