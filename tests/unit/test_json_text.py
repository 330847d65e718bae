import json

import pytest

from tasks.json_text import unstorable_json


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": "x\x00y"}, "a NUL character"),
        ({"a\x00": 1}, "a NUL character"),
        (["\ud800"], "an unpaired surrogate"),
        ({"\udfff": 1}, "an unpaired surrogate"),
        ({"a": "\ud83d\ude00"}, "an unpaired surrogate"),  # a pair of escapes decoded separately is still unpaired text
        ({"a": "\U0001f600", "b": "\\u0000 is text here", "c": "\\ud800 too"}, None),
        ({"a": "plain", "n": [1, 2.5, None, True]}, None),
    ],
)
def test_what_jsonb_cannot_store_is_named(value, problem):
    assert unstorable_json(json.dumps(value), value) == problem


def test_a_surrogate_pair_written_as_escapes_in_json_text_is_one_character():
    text = '{"a": "\\ud83d\\ude00"}'
    value = json.loads(text)
    assert value == {"a": "\U0001f600"} and unstorable_json(text, value) is None
