"""Moved: the exceptions are the engine's, imported from ``tasks``; importing this module says so."""

raise ImportError(
    "reliability_console.exceptions is gone: import the exceptions from tasks "
    "(from tasks import PermanentError, TransientError, ...), where they are defined in tasks.exceptions"
)
