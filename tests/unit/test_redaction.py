from tasks.redaction import REDACTED, redact

PATTERN = r"password|token|secret|authorization|card"


def test_secret_keys_are_redacted_at_any_depth():
    data = {"user": "a", "Password": "x", "nested": [{"api_token": "y", "ok": 1}], "card_number": "4111"}
    assert redact(data, PATTERN) == {
        "user": "a",
        "Password": REDACTED,
        "nested": [{"api_token": REDACTED, "ok": 1}],
        "card_number": REDACTED,
    }


def test_redaction_does_not_modify_the_original():
    data = {"secret": "keep me in the database"}
    redact(data, PATTERN)
    assert data == {"secret": "keep me in the database"}


def test_absurdly_deep_payloads_are_cut():
    deep: dict = {}
    cursor = deep
    for _ in range(100):
        cursor["next"] = {}
        cursor = cursor["next"]
    assert "[redacted]" in str(redact(deep, PATTERN))
