"""Redaction: secret shapes go, harmless look-alikes stay, a task's own input secrets go wherever they appear.

The corpus is data: each shape is its own case, so a rule that stops
matching (or starts matching too much) names the string it got wrong.
"""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest

from tasks.delivery.enqueue import job_id
from tasks.execution.context import effect_key
from tasks.lifecycle.clients import api_client_create, api_client_signing_secret
from tasks.redaction import (
    REDACTED,
    REDACTION_RULES,
    TaskRedactor,
    input_secrets,
    query_strings_redacted,
    redact,
    redact_query,
    redact_text,
)

PATTERN = r"password|token|secret|authorization|card"
TASK_ID = uuid.UUID("9f71c7a7-d8f6-4eaa-b869-744ec9504bbf")
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFsaWNlIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2\n-----END RSA PRIVATE KEY-----"

# (text, the secret in it): after redaction the secret is gone and "[redacted]" is there.
SECRET_SHAPES = [
    ("rejected Authorization: Bearer sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc", "sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc"),
    ("retrying with header bearer ya29.a0AfH6SMBx3kQ-Lm", "ya29.a0AfH6SMBx3kQ-Lm"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("Authorization: token 0a1b2c3d4e5f6a7b8c9d", "0a1b2c3d4e5f6a7b8c9d"),
    ("charge failed with key sk_test_4eC39HqLyjWDarjtT1zdp7dc", "sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
    ("restricted key rk_live_51H8xYzAbCdEfGhIjK in use", "rk_live_51H8xYzAbCdEfGhIjK"),
    ("signature check used whsec_MfKQ9r8GKYqrTwjUPD8ILPZIK2YnXsdV", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIK2YnXsdV"),
    ("openai rejected sk-proj-AbCdEf0123456789GhIjKlMnOp", "sk-proj-AbCdEf0123456789GhIjKlMnOp"),
    ("anthropic rejected sk-ant-api03-AbCdEf0123456789GhIjKl_mn", "sk-ant-api03-AbCdEf0123456789GhIjKl_mn"),
    ("clone with ghp_16C7e42F292c6912E7710c838347Ae178B4a failed", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("app token ghs_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "ghs_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    (
        "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzAB",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzAB",
    ),
    ("gitlab said 401 for glpat-Ab3dEf6hIj9kLm2nOp5q", "glpat-Ab3dEf6hIj9kLm2nOp5q"),
    ("npm publish with npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    ("hub download hf_aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH"),
    ("s3 denied access for AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("temporary credentials ASIAY34FZKBOKMUTVV7A expired", "ASIAY34FZKBOKMUTVV7A"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("maps call with AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
    (
        "slack said invalid_auth for xoxb-123456789012-1234567890123-AbCdEfGh",
        "xoxb-123456789012-1234567890123-AbCdEfGh",
    ),
    ("user token xoxp-1234567890-0987654321-AbCdEf", "xoxp-1234567890-0987654321-AbCdEf"),
    (
        "POST https://hooks.slack.com/services/T0A1B2C3D/B0A1B2C3D/aBcDeFgHiJkLmNoPqRsTuVwX timed out",
        "T0A1B2C3D/B0A1B2C3D/aBcDeFgHiJkLmNoPqRsTuVwX",
    ),
    (
        "POST https://discord.com/api/webhooks/112233445566778899/aBcD-eFgH_iJkLmNoP returned 404",
        "112233445566778899/aBcD-eFgH_iJkLmNoP",
    ),
    (
        "sendgrid: 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",
        "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",
    ),
    (f"token expired: {JWT}", JWT),
    ("git fetch https://deploy:s3cr3tPass@git.example.com/repo.git failed", "s3cr3tPass"),
    ("cannot reach redis://:r3dis-pw@cache:6379/0", "r3dis-pw"),
    ("502 Server Error for url: https://api.example.com/v1/items?api_key=AbC123xyz&page=2", "AbC123xyz"),
    ("GET /oauth/callback?code=1&access_token=ya29AbCdEf123 failed", "ya29AbCdEf123"),
    ("redirect to /reset?token=tok9f8e7d6c5b", "tok9f8e7d6c5b"),
    ("form client_secret=cs-live-abc12345&grant_type=client_credentials", "cs-live-abc12345"),
    ("login password=hunter2&user=bob", "hunter2"),
    ("rejected {'user': 'bob', 'password': 'hunter2'}", "hunter2"),
    ('rejected {"api_key": "AbC123xyz-987", "user": "bob"}', "AbC123xyz-987"),
    ('rejected {"db_password": "correct horse battery staple"}', "correct horse battery staple"),
    ("{'pw': 1, 'passphrase': \"it's a secret \\\" too\"}", "it's a secret \\\" too"),
    ("request had X-Api-Key: 0f1e2d3c4b5a6978", "0f1e2d3c4b5a6978"),
    ("secret: swordfish42", "swordfish42"),
    ("Cookie: sessionid=abc123def456", "abc123def456"),
    ("card_number=4111111111111111 declined", "4111111111111111"),
    (f"could not load key\n{PEM}\n", "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2"),
]

# Harmless strings that only look like secrets: none of them may change.
LOOK_ALIKES = [
    str(TASK_ID),
    f"task {TASK_ID} failed at step charge_quota",
    effect_key(TASK_ID, 1, "charge_quota", "charge"),
    effect_key(TASK_ID, 2, "refresh_token", "secret"),
    job_id(TASK_ID, 3),
    hashlib.sha256(b"request").hexdigest(),
    "report:charge_quota:insufficient_quota",
    "charge ch_3N4bXq2eZvKYlo2C1a2b3c4d refunded",
    "payment pi_3N4bXq2eZvKYlo2C0abcdefg for cus_NffrFeUfNV2Hib",
    '{"charge_id": "ch_000001", "balance": 9}',
    "{'user_id': 'alice', 'topic': 'sales'}",
    "2026-12-01T07:00:43.123456+00:00",
    "deadline 2026-12-01 07:00:43 UTC",
    "https://api.example.com/v1/files/report.pdf?page=2&size=10",
    "https://alice@example.com/profile",
    "postgresql://postgres@127.0.0.1:5432/rc_redact",
    "http://localhost:8000/admin/tasks/task/",
    "mailto:alice@example.com",
    "password reset succeeded",
    "token bucket refilled: 5 tokens left",
    "max_tokens=4096",
    "token_type: bearer",
    "keyboard layout: us",
    "monkey=banana",
    "author: Jane Doe",
    "authentication failed: 401 Unauthorized",
    "secretary=Jane",
    "cardinality=12",
    "Bearer",
    "send a valid token as Authorization: Bearer <token>",
    "Authorization: Bearer",
    "the bearer of bad news",
    "keys starting with sk_live_ are refused",
    "AKIA is the prefix of an access key id",
    "xoxo, the team",
    "see hooks.slack.com for the setup",
    "-----BEGIN PUBLIC KEY-----",
    "step charge_quota attempt 3 of 5 failed (code=insufficient_quota)",
    "Retry-After: 30",
    "version 1.2.3-beta+build.5 on 127.0.0.1:6379",
    "Input (secrets redacted)",
    "ghost_writer_01234567890123456789012345678901",
    # Look-alikes of this engine's own tokens (rc_ and 43 URL-safe characters): names, prefixes, the admin's hint.
    "rc_config",
    "the rc_ prefix marks an API token",
    "rc_token rc_abc rc_2024",
    "client rc_AbCdEf1 (token prefix shown in the admin)",
    "rc_" + "a_long_snake_case_name_of_forty_three_chars",
    "src_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE",
    "rc_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdEf",  # 44: not one of ours
    "whsec_ is the prefix of a signing secret",
]


@pytest.mark.parametrize(("text", "secret"), SECRET_SHAPES, ids=[text[:40] for text, _ in SECRET_SHAPES])
def test_a_secret_shape_is_redacted(text, secret):
    redacted = redact_text(text)
    assert secret not in redacted and REDACTED in redacted


@pytest.mark.parametrize("text", LOOK_ALIKES, ids=[text[:40] for text in LOOK_ALIKES])
def test_a_harmless_look_alike_is_left_alone(text):
    assert redact_text(text) == text


def test_the_corpus_has_at_least_thirty_of_each():
    assert len(SECRET_SHAPES) >= 30 and len(LOOK_ALIKES) >= 30


@pytest.mark.parametrize(("text", "secret"), SECRET_SHAPES, ids=[text[:40] for text, _ in SECRET_SHAPES])
def test_redacting_twice_changes_nothing(text, secret):
    once = redact_text(text)
    assert redact_text(once) == once


def test_only_the_secret_part_goes_the_rest_stays_readable():
    assert redact_text("GET https://api.example.com/v1?api_key=AbC123xyz&page=2 failed") == (
        "GET https://api.example.com/v1?api_key=[redacted]&page=2 failed"
    )
    assert redact_text("rejected {'user': 'bob', 'password': 'hunter2'}") == (
        "rejected {'user': 'bob', 'password': '[redacted]'}"
    )
    assert redact_text("git clone https://deploy:s3cr3tPass@git.example.com/r.git") == (
        "git clone https://deploy:[redacted]@git.example.com/r.git"
    )


# Texts that would make a backtracking rule take quadratic time or worse: an unended PEM block took
# 6 s, "sk-a-sk-a-…" and "a-a-a-…" before a "://" seconds (their rules are bounded now).
PATHOLOGICAL = {
    "unended private keys": "-----BEGIN RSA PRIVATE KEY-----",
    "unclosed quotes": "token='",
    "hyphen runs before a scheme": "a-",
    "hyphenated sk- keys": "sk-a-",
    "colons in a URL": "http://a:",
    "bearer words": "bearer ",
    "secret names": "db_password_",
    "JWT headers": "eyJaaaaaa.",
    "API token prefixes": "rc_",
    "signing secret prefixes": "whsec_-",
}
# One of each rule's hints, so that every rule searches the text.
EVERY_HINT = " ".join(sorted({hint for rule in REDACTION_RULES for hint in rule.hints}))


@pytest.mark.parametrize("fragment", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_redaction_takes_linear_time_on_pathological_text(fragment):
    text = f"{EVERY_HINT} {fragment * (50_000 // len(fragment))}"
    started = time.perf_counter()
    redact_text(text)
    assert time.perf_counter() - started < 1.0  # about 0.05 s; a quadratic rule takes seconds


# --- a task's own input secrets ---------------------------------------------------------------------------


def test_the_values_of_secret_input_keys_are_redacted_wherever_they_appear():
    redactor = TaskRedactor({"user": "bob", "password": "hunter2", "nested": {"api_token": "t0k3n-abc"}})
    assert redactor.text("login as bob with hunter2 refused; t0k3n-abc expired") == (
        f"login as bob with {REDACTED} refused; {REDACTED} expired"
    )
    assert redactor.value({"echo": ["hunter2!"], "user": "bob"}) == {"echo": [f"{REDACTED}!"], "user": "bob"}


def test_input_secrets_are_the_scalars_under_secret_keys_at_any_depth_longest_first():
    data = {
        "user": "bob-the-builder",
        "credentials": {"login": "bobby1", "secret_pin": 123456789},
        "passwords": ["first-pw", "second-pw-longer"],
        "token": "abc",  # too short to look for: it would match by chance
        "card_ok": True,
    }
    assert input_secrets(data, r"secret|password|token|credential|card") == (
        "second-pw-longer",
        "123456789",
        "first-pw",
        "bobby1",
    )


def test_a_task_without_secret_input_keys_redacts_only_shapes():
    redactor = TaskRedactor({"user_id": "alice", "topic": "sales"})
    assert redactor.secrets == ()
    assert redactor.text("alice asked for sales") == "alice asked for sales"


# --- keys of a structure --------------------------------------------------------------------------------------


def test_secret_keys_are_redacted_at_any_depth():
    data = {"user": "a", "Password": "x", "nested": [{"api_token": "y", "ok": 1}], "card_number": "4111"}
    assert redact(data, PATTERN) == {
        "user": "a",
        "Password": REDACTED,
        "nested": [{"api_token": REDACTED, "ok": 1}],
        "card_number": REDACTED,
    }


def test_string_values_of_a_structure_are_redacted_by_shape():
    data = {"note": "Authorization: Bearer sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc", "count": 3, "ok": None}
    assert redact(data, PATTERN) == {"note": f"Authorization: {REDACTED}", "count": 3, "ok": None}


def test_redaction_does_not_modify_the_original():
    data = {"secret": "keep me in the database", "note": "password=hunter2"}
    redact(data, PATTERN)
    assert data == {"secret": "keep me in the database", "note": "password=hunter2"}


def test_absurdly_deep_payloads_are_cut():
    deep: dict = {}
    cursor = deep
    for _ in range(100):
        cursor["next"] = {}
        cursor = cursor["next"]
    assert "[redacted]" in str(redact(deep, PATTERN))


# --- the deployment's own rules -------------------------------------------------------------------------------


def test_configured_patterns_add_to_the_defaults(settings):
    settings.RELIABILITY_REDACT_PATTERNS = [r"\bacme_[0-9a-f]{8}\b", r"(?i)\bpin (?P<secret>\d{4})\b"]
    text = "acme_0badcafe rejected PIN 1234 and sk_test_4eC39HqLyjWDarjtT1zdp7dc"
    assert redact_text(text) == f"{REDACTED} rejected PIN {REDACTED} and {REDACTED}"
    settings.RELIABILITY_REDACT_PATTERNS = []
    assert redact_text("acme_0badcafe") == "acme_0badcafe"


def test_configured_patterns_apply_to_short_strings_too(settings):
    settings.RELIABILITY_REDACT_PATTERNS = [r"\bT-\d{2}\b"]
    assert redact_text("T-42") == REDACTED


# --- this engine's own secrets: API tokens and callback signing secrets, as tasks.lifecycle.clients makes them -------


@pytest.mark.django_db
def test_every_api_token_the_engine_makes_is_redacted_whole():
    tokens = [api_client_create(name=f"client-{index}")[1] for index in range(100)]
    for token in tokens:
        for text in (token, f"retry with {token}.", f"{{'ref': '{token}'}}", f"ref={token}&page=2", f"({token})"):
            redacted = redact_text(text)
            assert token not in redacted and REDACTED in redacted, text
            # Whole: no piece of it is left either side of the mark.
            assert token[:10] not in redacted and token[-6:] not in redacted, redacted


@pytest.mark.django_db
def test_every_signing_secret_the_engine_makes_is_redacted_whole():
    api_client_create(name="signer")
    made = [api_client_signing_secret(name="signer", rotate=True) for _ in range(300)]
    # token_urlsafe puts "-" and "_" anywhere: among these, secrets with each of them in their first 16
    # characters (the old rule's minimum, which left such a secret unredacted) and in the middle.
    for symbol in "-_":
        assert any(symbol in secret[6:22] for secret in made) and any(symbol in secret[22:-1] for secret in made)
    for secret in made:
        for text in (secret, f"signed with {secret}; refused", f'"v1={secret}"'):
            redacted = redact_text(text)
            assert secret not in redacted and REDACTED in redacted, text
            assert secret[6:12] not in redacted and secret[-4:] not in redacted, redacted


# --- query strings in log lines -------------------------------------------------------------------------------


def test_a_query_string_loses_its_credentials_and_keeps_the_rest():
    token = "rc_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE"
    assert redact_query(f"token={token}&page=2") == f"token={REDACTED}&page=2"
    assert (
        redact_query("access_token=abc&api_key=xyz&user=bob") == f"access_token={REDACTED}&api_key={REDACTED}&user=bob"
    )
    assert (
        redact_query("X-Amz-Signature=0f1e2d&X-Amz-Date=20261201") == f"X-Amz-Signature={REDACTED}&X-Amz-Date=20261201"
    )
    assert redact_query(f"q={token}") == f"q={REDACTED}"  # an innocent name, a token's shape
    assert redact_query("page=2&flag&empty=") == "page=2&flag&empty="
    assert redact_query("api%5Fkey=xyz") == f"api%5Fkey={REDACTED}"
    # A query inside a value (the admin's ?next=), encoded: a token there goes with its whole value.
    assert redact_query(f"next=/admin/%3Ftoken%3D{token}&x=1") == f"next={REDACTED}&x=1"
    assert redact_query("next=/admin/tasks/%3Fstate%3Dfailed") == "next=/admin/tasks/%3Fstate%3Dfailed"


def test_every_query_string_in_a_log_line_is_redacted():
    line = (
        "Unauthorized: /api/v1/tasks request=\"<WSGIRequest: GET '/api/v1/tasks?token=abc"
        "&limit=2'>\" referer=https://example.com/a?api_key=xyz#top"
    )
    assert query_strings_redacted(line) == (
        f"Unauthorized: /api/v1/tasks request=\"<WSGIRequest: GET '/api/v1/tasks?token={REDACTED}"
        f"&limit=2'>\" referer=https://example.com/a?api_key={REDACTED}#top"
    )
    # Structured fields are not queries: a fencing token is left alone.
    assert query_strings_redacted("event=task_claimed fencing_token=5") == "event=task_claimed fencing_token=5"
