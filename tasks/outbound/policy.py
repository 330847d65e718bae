"""Where the engine's own outbound requests may go: completion callbacks and alert notifications.

Both send to a URL someone typed (an API client's ``callback_url``, a
supervisor's alert channel), from inside our network, so both go through one
check before anything is sent:

- the URL: http(s), at most ``MAX_URL_LENGTH`` printable ASCII characters, no
  credentials (``user:password@``), a host;
- the host: in the allow-list when there is one (``host`` for any port,
  ``host:port`` for one; exact, no wildcards). Without an allow-list (alert
  channels only; callbacks are off then) any host whose addresses are all
  public;
- every address the host resolves to (an IP literal is its own address):
  never unspecified, multicast, reserved, link-local or a cloud metadata
  address, whoever listed it; loopback, private and shared (CGNAT) addresses
  only for a host the allow-list names. An operator who lists an internal
  receiver trusts it; nobody else can aim our servers at one.

Requests to a host the allow-list does not name go through
``public_session()``, which connects to the address it checked (a name that
resolves to a public address for the check and to 127.0.0.1 a moment later is
refused when it connects), and no sender follows a redirect.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import requests
from requests_hardened import Config as HardenedConfig
from requests_hardened import Manager as HardenedManager
from requests_hardened.ip_filter import InvalidIPAddress

from tasks.exceptions import ReliabilityError

# Browsers and proxies handle about this much; a longer URL is a mistake or an attack.
MAX_URL_LENGTH = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}
# Instance metadata services answer credentials to whoever asks from inside: never, even when listed.
# (AWS/GCP/Azure IMDS, AWS ECS task metadata, Alibaba, Azure's wire server, AWS's IPv6 IMDS and DNS.)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "100.100.100.200",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)
# Prefixes that carry another address inside (IPv4 in IPv6): the outer address looks public while the
# packet may reach the inner one, so they count as not public.
TRANSLATION_NETWORKS = tuple(
    ipaddress.ip_network(network) for network in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "100.64.0.0/10")
)


class Rule:
    """Why a URL is refused: a stable code, for messages in the reader's language and for tests."""

    SCHEME = "scheme"
    LENGTH = "length"
    CHARACTERS = "characters"
    CREDENTIALS = "credentials"
    NO_HOST = "no_host"
    INVALID = "invalid"
    HOST_NOT_ALLOWED = "host_not_allowed"
    OFF = "off"
    UNRESOLVABLE = "unresolvable"
    ADDRESS_FORBIDDEN = "address_forbidden"
    ADDRESS_NOT_PUBLIC = "address_not_public"


class OutboundUrlRefused(ReliabilityError):
    """A URL our servers will not send to; ``rule`` says which check refused it, ``params`` its facts."""

    code = "outbound_url_refused"

    def __init__(self, message: str, *, rule: str, params: dict[str, str] | None = None) -> None:
        super().__init__(message, details={"rule": rule, **(params or {})})
        self.rule = rule
        self.params = params or {}


@dataclass(frozen=True)
class OutboundPolicy:
    """Which hosts a kind of outbound request may reach.

    ``allowed_hosts`` empty: ``public_hosts`` says whether any public host is
    allowed (alert channels) or nothing is (callbacks: off).
    ``what`` names the URL in messages (``callback_url``, ``the channel's URL``).
    """

    what: str
    setting: str
    allowed_hosts: Sequence[str] = field(default_factory=tuple)
    public_hosts: bool = False
    off_message: str = "outbound requests are off on this server"


@dataclass(frozen=True)
class OutboundTarget:
    url: str
    host: str
    port: int
    listed: bool


Resolver = Callable[[str, int], list[str]]


def resolved_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (TCP), as getaddrinfo gives them."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)))


def outbound_url_check(url: object, *, policy: OutboundPolicy, resolve: Resolver | None = None) -> OutboundTarget:
    """``url``'s target if the policy lets our servers send to it, else ``OutboundUrlRefused``.

    ``resolve``: look the host up (``resolved_addresses``) and check every
    address; without it only an IP literal's address is checked (no DNS on a
    hot path: a callback's submission). Senders resolve again before each
    request.
    """
    if not isinstance(url, str):
        raise _refused(policy, Rule.INVALID, f"{policy.what} must be a string")
    if not policy.allowed_hosts and not policy.public_hosts:
        raise _refused(policy, Rule.OFF, f"{policy.off_message} ({policy.setting} is empty)")
    if not 1 <= len(url) <= MAX_URL_LENGTH:
        raise _refused(policy, Rule.LENGTH, f"{policy.what} must be 1 to {MAX_URL_LENGTH} characters")
    if not all(33 <= ord(ch) < 127 for ch in url):
        raise _refused(
            policy,
            Rule.CHARACTERS,
            f"{policy.what} must be printable ASCII without spaces (an IDN host in its xn-- form)",
        )
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refused(policy, Rule.INVALID, f"{policy.what} is not a valid URL") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise _refused(policy, Rule.SCHEME, f"{policy.what} must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise _refused(policy, Rule.CREDENTIALS, f"{policy.what} must not hold credentials (user:password@)")
    if not parts.hostname:
        raise _refused(policy, Rule.NO_HOST, f"{policy.what} has no host")
    host = parts.hostname.lower().strip("[]")
    port = port or DEFAULT_PORTS[parts.scheme]
    listed = host_listed(host, port, policy.allowed_hosts)
    if policy.allowed_hosts and not listed:
        raise _refused(
            policy,
            Rule.HOST_NOT_ALLOWED,
            f"{policy.what}'s host {host!r} is not allowed on this server (not in {policy.setting})",
            host=host,
        )
    addresses = _literal(host)
    if addresses is None and resolve is not None:
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError):
            addresses = []
        if not addresses:
            raise _refused(policy, Rule.UNRESOLVABLE, f"{policy.what}'s host {host!r} does not resolve", host=host)
    for address in addresses or ():
        rule = address_refusal(address, listed=listed)
        if rule == Rule.ADDRESS_FORBIDDEN:
            raise _refused(
                policy,
                rule,
                f"{policy.what}'s host {host!r} is at {address}, a link-local, metadata, multicast or reserved "
                "address: never allowed",
                host=host,
                address=address,
            )
        if rule == Rule.ADDRESS_NOT_PUBLIC:
            raise _refused(
                policy,
                rule,
                f"{policy.what}'s host {host!r} is at {address}, a loopback, private or shared address: only a "
                f"host listed in {policy.setting} may be",
                host=host,
                address=address,
            )
    return OutboundTarget(url=url, host=host, port=port, listed=listed)


def address_refusal(address: str, *, listed: bool) -> str | None:
    """The rule that refuses sending to ``address`` (for a host the allow-list names, or not), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return Rule.ADDRESS_FORBIDDEN
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip in METADATA_ADDRESSES:
        return Rule.ADDRESS_FORBIDDEN
    if ip.is_loopback:
        # Before the reserved check: ::1 lies in IPv6's reserved ::/8.
        return None if listed else Rule.ADDRESS_NOT_PUBLIC
    if ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return Rule.ADDRESS_FORBIDDEN
    if listed:
        return None
    if not ip.is_global or any(ip in network for network in TRANSLATION_NETWORKS if network.version == ip.version):
        return Rule.ADDRESS_NOT_PUBLIC
    return None


def host_listed(host: str, port: int, allowed_hosts: Sequence[str]) -> bool:
    """Whether ``host:port`` matches an entry of ``allowed_hosts`` (``host`` or ``host:port``; exactly)."""
    host = host.lower().strip("[]")
    for entry in allowed_hosts:
        allowed = urllib.parse.urlsplit(f"//{entry}")
        if (allowed.hostname or "").strip("[]") == host and allowed.port in (None, port):
            return True
    return False


def session_for(target: OutboundTarget) -> requests.Session:
    """A session to send to ``target`` with: a listed host's own, else one that connects only to public addresses."""
    return requests.Session() if target.listed else public_session()


def public_session() -> requests.Session:
    """A session that resolves each host once, refuses a non-public address and connects to the one it checked."""
    return _PUBLIC_ONLY.get_session()


def is_refused_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is ``public_session()`` refusing an address at connect time (not a network error)."""
    return isinstance(exc, InvalidIPAddress)


_PUBLIC_ONLY = HardenedManager(
    HardenedConfig(
        ip_filter_enable=True,
        ip_filter_allow_loopback_ips=False,
        never_redirect=True,
        default_timeout=(5, 30),
    )
)


def _literal(host: str) -> list[str] | None:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        return None


def _refused(policy: OutboundPolicy, rule: str, message: str, **params: str) -> OutboundUrlRefused:
    return OutboundUrlRefused(message, rule=rule, params={"what": policy.what, **params})
