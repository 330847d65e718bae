"""The operator console in Django's admin, one module per concern.

``triage`` (dead letters: list, item page, confirmation pages), ``bulk``
(bulk actions), ``audit`` (the audit log), ``alerting`` (rules, channels,
history) and ``task_pages`` (the engine's tasks and API clients, read-only).
Views parse the request, check the page's permission, call one service and
render; the rules live in the services (``dlq.actions``, ``dlq.bulk``, the
engine's ``tasks.lifecycle.operator``).
"""

from dlq.admin import alerting, audit, bulk, task_pages, triage  # noqa: F401  (each registers its admins)
