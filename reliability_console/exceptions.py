"""The old home of the exception hierarchy, kept so existing pipelines keep importing; it lives in tasks.exceptions."""

from tasks.exceptions import (  # noqa: F401
    ConfigurationError,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidTaskInput,
    LeaseLost,
    PermanentError,
    ReliabilityError,
    StepTimeout,
    TaskNotActionable,
    TransientError,
    UnknownPipeline,
)
