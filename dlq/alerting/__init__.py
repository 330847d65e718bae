"""Alerting on the dead-letter queue and the sweeper: rules (``rules``) measured by ``measures``, notified
through ``notifications`` on the engine's ``alert_notify`` pipeline (``pipeline``) to ``channels``.

Nothing is imported here: the app's models module imports ``alerting.models``
while the app registry loads, before the other modules can be.
"""
