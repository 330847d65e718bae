"""System checks of the console's configuration: ``manage.py check`` names each wrong setting in one line."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from dlq.conf import console_settings


@register()
def settings_checked(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """dlq.E001: a setting of the console set to a value its rule refuses (type, range, URL, hosts)."""
    return [Error(problem, id="dlq.E001") for _, problem in console_settings.problems()]
