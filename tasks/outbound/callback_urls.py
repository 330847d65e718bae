"""Which URLs a completion callback may name: ``RELIABILITY_CALLBACK_ALLOWED_HOSTS`` and ``tasks.outbound.policy``'s
rules.

Checked at submission (``tasks.submission.submit``) and again, with the name resolved, by the sender before each
attempt (``tasks.outbound.callback_sending``).
"""

from __future__ import annotations

from typing import Any

from tasks.conf import engine_settings
from tasks.exceptions import InvalidTaskInput
from tasks.outbound.policy import OutboundPolicy, OutboundUrlRefused, Resolver, outbound_url_check


def callback_policy() -> OutboundPolicy:
    """Callbacks reach only the hosts the deployment lists (none: callbacks are off)."""
    return OutboundPolicy(
        what="callback_url",
        setting="RELIABILITY_CALLBACK_ALLOWED_HOSTS",
        allowed_hosts=engine_settings.CALLBACK_ALLOWED_HOSTS,
        off_message="callbacks are off on this server",
    )


def callback_url_check(url: Any, *, resolve: Resolver | None = None) -> str:
    """``url`` if the engine may POST to it, else ``InvalidTaskInput`` (the API's 400 ``validation_error``).

    The rules of ``tasks.outbound.policy``: an http(s) URL without credentials whose
    host (and port) is listed and is at no forbidden address. At submission
    only an IP literal's address is checked; ``resolve`` (the sender, before
    each attempt) checks every address the name has then.
    """
    try:
        outbound_url_check(url, policy=callback_policy(), resolve=resolve)
    except OutboundUrlRefused as exc:
        raise InvalidTaskInput(exc.message, details={"callback_url": exc.message, "rule": exc.rule}) from None
    return url
