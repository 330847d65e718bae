"""How a package exports names its modules define, each loaded on first use (PEP 562).

``tasks`` (the public names), ``tasks.lifecycle`` (the door's acts) and ``tasks.selectors`` (the reads) each list
``name -> module`` and take their module ``__getattr__`` and ``__dir__`` from ``lazy_exports``: importing the
package imports none of those modules, so no model is loaded before Django's apps are ready and the engine's own
modules import the module they call without a cycle through the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, names: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its ``namespace``: its ``globals()``) for ``names``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *names])

    return __getattr__, __dir__
