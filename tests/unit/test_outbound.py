"""The outbound rules shared by callbacks and alert channels: which URLs and addresses our servers may reach."""

from __future__ import annotations

import pytest

from tasks.outbound.policy import (
    OutboundPolicy,
    OutboundUrlRefused,
    Rule,
    address_refusal,
    outbound_url_check,
    resolved_addresses,
)

PUBLIC = OutboundPolicy(what="url", setting="HOSTS", public_hosts=True)
LISTED = OutboundPolicy(what="url", setting="HOSTS", allowed_hosts=("hooks.internal", "127.0.0.1:9000", "[::1]"))
OFF = OutboundPolicy(what="url", setting="HOSTS", off_message="callbacks are off")


@pytest.mark.parametrize(
    ("address", "unlisted", "listed"),
    [
        ("8.8.8.8", None, None),
        ("2001:4860:4860::8888", None, None),
        ("127.0.0.1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("127.255.0.9", Rule.ADDRESS_NOT_PUBLIC, None),
        ("::1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("::ffff:127.0.0.1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("10.1.2.3", Rule.ADDRESS_NOT_PUBLIC, None),
        ("172.16.0.1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("192.168.1.1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("100.64.0.1", Rule.ADDRESS_NOT_PUBLIC, None),  # shared (CGNAT)
        ("fd12:3456::1", Rule.ADDRESS_NOT_PUBLIC, None),  # unique local
        ("::ffff:10.0.0.1", Rule.ADDRESS_NOT_PUBLIC, None),
        ("169.254.169.254", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("169.254.10.1", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("::ffff:169.254.169.254", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("fe80::1", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("fe80::1%eth0", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("fd00:ec2::254", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("100.100.100.200", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("168.63.129.16", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("0.0.0.0", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("::", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("224.0.0.1", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("ff02::1", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("255.255.255.255", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("240.0.0.1", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
        ("not-an-address", Rule.ADDRESS_FORBIDDEN, Rule.ADDRESS_FORBIDDEN),
    ],
)
def test_which_addresses_may_be_reached(address, unlisted, listed):
    assert address_refusal(address, listed=False) == unlisted
    assert address_refusal(address, listed=True) == listed


def refused(url, policy=PUBLIC, resolve=resolved_addresses) -> OutboundUrlRefused:
    with pytest.raises(OutboundUrlRefused) as raised:
        outbound_url_check(url, policy=policy, resolve=resolve)
    return raised.value


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost/",
        "http://127.1/",  # the resolver's shorthands for 127.0.0.1
        "http://2130706433/",
        "http://0x7f000001/",
        "http://017700000001/",
        "http://[::ffff:7f00:1]/",
    ],
)
def test_every_spelling_of_loopback_is_refused_after_resolution(url):
    assert refused(url).rule == Rule.ADDRESS_NOT_PUBLIC


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://hooks.example.com/", Rule.SCHEME),
        ("javascript:alert(1)", Rule.SCHEME),
        ("https://u:p@hooks.example.com/", Rule.CREDENTIALS),
        ("https://hooks.example.com/a b", Rule.CHARACTERS),
        ("https://hooks.example.com:99999/", Rule.INVALID),
        ("https:///x", Rule.NO_HOST),
        ("https://hooks.example.com/" + "x" * 2048, Rule.LENGTH),
        (["https://hooks.example.com/"], Rule.INVALID),
        ("https://nowhere.invalid/", Rule.UNRESOLVABLE),
    ],
)
def test_malformed_urls_name_their_rule(url, rule):
    assert refused(url).rule == rule


def test_an_allow_list_names_hosts_and_ports_exactly():
    def resolve(host, port):
        return {"hooks.internal": ["10.0.0.5"], "127.0.0.1": ["127.0.0.1"]}.get(host, ["8.8.8.8"])

    assert outbound_url_check("https://hooks.internal/x", policy=LISTED, resolve=resolve).listed
    assert outbound_url_check("http://127.0.0.1:9000/x", policy=LISTED, resolve=resolve).listed
    assert outbound_url_check("http://[::1]:1234/x", policy=LISTED, resolve=resolve).listed
    assert refused("http://127.0.0.1:9001/x", LISTED, resolve).rule == Rule.HOST_NOT_ALLOWED
    assert refused("https://hooks.internal.evil.org/x", LISTED, resolve).rule == Rule.HOST_NOT_ALLOWED
    assert refused("https://example.com/x", LISTED, resolve).rule == Rule.HOST_NOT_ALLOWED


def test_a_listed_name_that_resolves_to_a_metadata_address_is_refused():
    def resolve(host, port):
        return ["10.0.0.5", "169.254.169.254"]

    error = refused("https://hooks.internal/x", LISTED, resolve)
    assert error.rule == Rule.ADDRESS_FORBIDDEN and error.params["address"] == "169.254.169.254"


def test_one_private_address_among_public_ones_refuses_an_unlisted_name():
    error = refused("https://hooks.example.com/x", PUBLIC, lambda host, port: ["8.8.8.8", "10.0.0.1"])
    assert error.rule == Rule.ADDRESS_NOT_PUBLIC and error.params["host"] == "hooks.example.com"


def test_without_resolving_only_an_ip_literal_is_checked():
    assert outbound_url_check("https://hooks.example.com/x", policy=PUBLIC).host == "hooks.example.com"
    assert refused("http://169.254.169.254/latest/", PUBLIC, None).rule == Rule.ADDRESS_FORBIDDEN
    assert refused("http://[::1]/", PUBLIC, None).rule == Rule.ADDRESS_NOT_PUBLIC


def test_no_allow_list_and_no_public_hosts_is_off():
    error = refused("https://hooks.example.com/", OFF)
    assert error.rule == Rule.OFF and "callbacks are off" in error.message
