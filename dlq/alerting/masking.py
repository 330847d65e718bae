"""How a channel's secrets look to someone who may not change the channel: a hint, never the value.

A webhook's HMAC key and the path of a Slack incoming-webhook URL are
credentials: whoever reads them can forge or send notifications. The console
shows them whole only to users with the channel's change permission; the
rest see a prefix and the last 4 characters (``whsec_…abcd``), enough to tell
two channels apart. Error texts are scrubbed of both for everyone.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from dlq.alerting.models import AlertChannel

MASK = "…"
# Below this length the last 4 characters would be too large a share of the secret: show none.
SHORTEST_HINTED = 12
# A prefix up to and including an underscore this early is a kind marker (whsec_, xoxb-…), not secret material.
PREFIX_MAX = 8


def secret_masked(value: str) -> str:
    """``whsec_…abcd``: the kind prefix (or first 3 characters) and the last 4; only ``…`` for a short secret."""
    if not value:
        return ""
    if len(value) < SHORTEST_HINTED:
        return MASK
    cut = value.find("_", 0, PREFIX_MAX)
    prefix = value[: cut + 1] if cut >= 0 else value[:3]
    return f"{prefix}{MASK}{value[-4:]}"


def url_masked(url: str) -> str:
    """``https://hooks.slack.com/…abcd``: scheme and host, the rest hidden but its last 4 characters."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    number = _port(parts)
    port = f":{number}" if number else ""
    rest = url.split(parts.netloc, 1)[1] if parts.netloc else url
    if not rest.strip("/"):
        return f"{parts.scheme}://{host}{port}/"
    return f"{parts.scheme}://{host}{port}/{MASK}{rest[-4:] if len(rest) >= SHORTEST_HINTED else ''}"


def secrets_scrubbed(text: str, channel: AlertChannel) -> str:
    """``text`` with the channel's URL and secret replaced by their masked forms."""
    for value, masked in ((channel.url, url_masked(channel.url)), (channel.secret, secret_masked(channel.secret))):
        if value and value in text:
            text = text.replace(value, masked)
    return text


def _port(parts) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None
