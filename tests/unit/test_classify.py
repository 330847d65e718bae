import pytest
import requests

from tasks.exceptions import PermanentError, StepTimeout, TransientError
from tasks.execution.classify import classify


@pytest.mark.parametrize(
    ("exc", "transient", "code", "uncertain"),
    [
        (TransientError("x", code="http_503"), True, "http_503", True),
        (TransientError("x", code="rate_limited", retry_after=2, effect_uncertain=False), True, "rate_limited", False),
        (PermanentError("x", code="insufficient_quota"), False, "insufficient_quota", False),
        (StepTimeout("late"), True, "step_timeout", True),
        (requests.ReadTimeout("slow"), True, "timeout", True),
        (requests.ConnectionError("refused"), True, "connection_error", True),
        (TimeoutError("slow"), True, "timeout", True),
        (ConnectionResetError("reset"), True, "connection_error", True),
        (ValueError("bug"), False, "unhandled_exception", False),
        (KeyError("missing"), False, "unhandled_exception", False),
    ],
)
def test_classification(exc, transient, code, uncertain):
    result = classify(exc)
    assert (result.transient, result.code, result.effect_uncertain) == (transient, code, uncertain)
    assert result.error_class.endswith(type(exc).__qualname__)


def test_retry_after_is_carried():
    assert classify(TransientError("x", retry_after=3.5)).retry_after == 3.5


def test_policy_can_declare_extra_transient_types():
    class FlakyVendorError(Exception):
        pass

    assert not classify(FlakyVendorError()).transient
    assert classify(FlakyVendorError(), (FlakyVendorError,)).transient
