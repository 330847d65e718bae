"""A real HTTP webhook receiver on 127.0.0.1 (alerts, callbacks): records requests, fails or redirects on purpose."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int
    path: str = ""
    received_at: float = 0.0

    @property
    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def idempotency_key(self) -> str:
        return self.headers.get("idempotency-key", "")

    def signature_valid(self, secret: str, tolerance: float = 300, now: float | None = None) -> bool:
        # docs/alerts-and-metrics.md's verification, written out here so the test does not trust the code it checks.
        parts = dict(
            part.split("=", 1) for part in self.headers.get("reliability-signature", "").split(",") if "=" in part
        )
        if not parts.get("t", "").isdigit():
            return False
        timestamp = int(parts["t"])
        if abs((time.time() if now is None else now) - timestamp) > tolerance:
            return False
        signed = f"{timestamp}.{self.idempotency_key}.".encode() + self.body
        expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        return hmac.compare_digest(parts.get("v1", ""), expected)

    def callback_signature_valid(self, secret: str, tolerance: float = 300) -> bool:
        # A completion callback signs "<t>.<raw body>" (no key); any v1= may match (rotation).
        timestamp, signatures = None, []
        for part in self.headers.get("reliability-signature", "").split(","):
            name, _, value = part.partition("=")
            if name == "t" and value.isdigit():
                timestamp = int(value)
            elif name == "v1":
                signatures.append(value)
        if timestamp is None or abs(self.received_at - timestamp) > tolerance:
            return False
        expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + self.body, hashlib.sha256).hexdigest()
        return any(hmac.compare_digest(signature, expected) for signature in signatures)

    @property
    def signed_at(self) -> int:
        header = self.headers.get("reliability-signature", "")
        return int(header.split(",")[0].removeprefix("t="))


class WebhookReceiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.fail_next = 0  # answer this many requests with 500 before accepting
        self.redirect_to = ""  # answer every request with a 302 to this URL (it is served 200 when followed)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    status = 500 if receiver.fail_next > 0 else 200
                    if status == 500:
                        receiver.fail_next -= 1
                    redirect = receiver.redirect_to if not receiver.redirect_to.endswith(self.path) else ""
                    if redirect:
                        status = 302
                    headers = {key.lower(): value for key, value in self.headers.items()}
                    receiver.requests.append(Received(headers, body, status, self.path, time.time()))
                self.send_response(status)
                if redirect:
                    self.send_header("Location", redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                # Only a client that followed a redirect (POST becomes GET after a 302) ever gets here.
                with receiver._lock:
                    headers = {key.lower(): value for key, value in self.headers.items()}
                    receiver.requests.append(Received(headers, b"", 200, self.path, time.time()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop's next poll: at the default half second, every test that used a receiver
        # took half a second longer to end.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def accepted(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.answered == 200]

    def all(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
