"""Outbound HTTP and completion callbacks: every request the engine or a step sends.

- ``http``: ``ctx.http``, a step's session (deadline header and time left, effect keys, trace context).
- ``http_errors``: a failure by HTTP status: transient or permanent, and ``Retry-After``.
- ``policy``: where the engine's own requests may go (callbacks, alert channels): no SSRF.
- ``signing``: the ``Reliability-Signature`` header of every request the product signs.
- ``callback_urls``: which URLs a completion callback may name; ``callback_events``: the one callback task per
  terminal event; ``callback_sending``: the ``task_callback`` pipeline that POSTs it.
"""


def __getattr__(name: str):
    from tasks.moved import former_module_attribute

    return former_module_attribute(__name__, name)
