"""Where alert channels may send: the engine's outbound rules (``tasks.outbound.policy``) under the channels' own
allow-list, ``RELIABILITY_ALERT_ALLOWED_HOSTS``.

Empty (the default): any host whose every address is public, never loopback,
private, link-local or a metadata address. With entries: only those hosts,
which may then be internal (an Alertmanager on the private network). Checked
when a supervisor saves a channel (a form error naming the rule) and again
before every send (DNS and the setting change): a channel refused then is
switched off with its reason on the channel's page, not silently skipped.
"""

from __future__ import annotations

from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy

from dlq.alerting.models import URL_CHANNEL_KINDS, AlertChannel
from dlq.conf import console_settings
from tasks.outbound.policy import (
    OutboundPolicy,
    OutboundTarget,
    OutboundUrlRefused,
    Resolver,
    Rule,
    outbound_url_check,
    resolved_addresses,
)

ALERT_HOSTS_SETTING = "RELIABILITY_ALERT_ALLOWED_HOSTS"

# A webhook or Slack channel without a URL (the outbound rules never see one).
NO_URL_RULE = "no_url"
URL_REQUIRED = gettext_lazy("A webhook or Slack channel needs a URL.")
# The facts of a refusal that its sentence names (and that are stored with it).
REFUSAL_FACTS = ("host", "address")

# Why a channel's URL was refused, by the rule's code, in the reader's language.
REFUSAL_TEXTS = {
    NO_URL_RULE: URL_REQUIRED,
    Rule.INVALID: gettext_lazy("The URL is not valid."),
    Rule.LENGTH: gettext_lazy("The URL is too long (at most 2,048 characters)."),
    Rule.CHARACTERS: gettext_lazy("The URL must be printable ASCII without spaces (an IDN host in its xn-- form)."),
    Rule.SCHEME: gettext_lazy("The URL must start with http:// or https://."),
    Rule.CREDENTIALS: gettext_lazy("The URL must not hold credentials (user:password@)."),
    Rule.NO_HOST: gettext_lazy("The URL has no host."),
    Rule.HOST_NOT_ALLOWED: gettext_lazy(
        "Refused by the allow-list: the host %(host)s is not in RELIABILITY_ALERT_ALLOWED_HOSTS."
    ),
    Rule.UNRESOLVABLE: gettext_lazy("The host %(host)s does not resolve to any address."),
    Rule.ADDRESS_FORBIDDEN: gettext_lazy(
        "Refused: the host %(host)s is at %(address)s, a link-local, metadata, multicast or reserved address, "
        "which alerts may never reach."
    ),
    Rule.ADDRESS_NOT_PUBLIC: gettext_lazy(
        "Refused: the host %(host)s is at %(address)s, a loopback, private or shared address; only a host listed "
        "in RELIABILITY_ALERT_ALLOWED_HOSTS may be."
    ),
}


def alert_policy() -> OutboundPolicy:
    return OutboundPolicy(
        what="the channel's URL",
        setting=ALERT_HOSTS_SETTING,
        allowed_hosts=console_settings.ALERT_ALLOWED_HOSTS,
        public_hosts=True,
    )


def channel_url_check(url: str, *, resolve: Resolver | None = resolved_addresses) -> OutboundTarget:
    """Where a channel's ``url`` sends to, or ``OutboundUrlRefused``."""
    return outbound_url_check(url, policy=alert_policy(), resolve=resolve)


def refusal_text(code: str, params: dict) -> str:
    """A refusal's sentence in the reader's language (a code this release does not know: the code itself)."""
    text = REFUSAL_TEXTS.get(code)
    if text is None:
        return code
    facts = {"host": params.get("host", "?"), "address": params.get("address", "?")}
    return str(text) % facts


def channel_url_refusal(*, kind: str, url: str) -> dict[str, str] | None:
    """Why a channel of ``kind`` may not send to ``url`` (``rule`` and its facts), or None when it may."""
    if kind not in URL_CHANNEL_KINDS:
        return None
    if not url:
        return {"rule": NO_URL_RULE}
    try:
        channel_url_check(url)
    except OutboundUrlRefused as exc:
        return {"rule": exc.rule, **refusal_facts(exc)}
    return None


def refusal_facts(refusal: OutboundUrlRefused) -> dict[str, str]:
    return {key: str(value) for key, value in refusal.params.items() if key in REFUSAL_FACTS}


def channel_url_errors(*, kind: str, url: str) -> dict[str, str]:
    """The form's errors for a channel of ``kind`` sending to ``url`` (by field), none when it may send there."""
    refusal = channel_url_refusal(kind=kind, url=url)
    return {} if refusal is None else {"url": refusal_text(refusal["rule"], refusal)}


def channel_disabled(*, channel: AlertChannel, refusal: OutboundUrlRefused) -> None:
    """Switch ``channel`` off because its URL was refused at send time, keeping why (shown on its pages)."""
    params = refusal_facts(refusal)
    AlertChannel.objects.filter(pk=channel.pk).update(
        enabled=False, disabled_reason_code=refusal.rule, disabled_reason_params=params, disabled_at=timezone.now()
    )
    channel.enabled, channel.disabled_reason_code, channel.disabled_reason_params = False, refusal.rule, params


def disabled_text(channel: AlertChannel) -> str:
    """Why the engine switched ``channel`` off, in the reader's language; empty when it did not."""
    if not channel.disabled_reason_code:
        return ""
    return gettext("switched off: %(why)s") % {
        "why": refusal_text(channel.disabled_reason_code, channel.disabled_reason_params)
    }
