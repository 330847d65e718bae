"""The project's settings without the console: the engine alone (tests/acceptance/test_engine_without_console.py)."""

from reliability_console.settings import *  # noqa: F403
from reliability_console.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if not app.startswith(("dlq", "devtools"))]
ROOT_URLCONF = "tests.engine_only.urls"
