"""The campaign's HTTP clients: one ``requests`` session per client thread, with the campaign's API token."""

from __future__ import annotations

import threading

import requests

# How long a client waits for an answer before it counts the answer as lost.
CLIENT_TIMEOUT = 30.0


def thread_session(local: threading.local, token: str) -> requests.Session:
    """The calling thread's session in ``local``, made on its first use."""
    session = getattr(local, "session", None)
    if session is None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        local.session = session
    return session
