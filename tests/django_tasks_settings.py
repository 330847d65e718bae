"""The project's settings with Django's Tasks framework run by the engine (tests/acceptance/test_django_tasks_live)."""

from reliability_console.settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "tasks.backends.ReliabilityBackend",
        "OPTIONS": {"RETRY_BASE_SECONDS": 0.2, "RETRY_MAX_SECONDS": 0.5},
    }
}
