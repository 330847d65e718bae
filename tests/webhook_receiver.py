"""A real HTTP webhook receiver on 127.0.0.1 for alerting tests: records every request, can fail on purpose."""

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

    @property
    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def idempotency_key(self) -> str:
        return self.headers.get("idempotency-key", "")

    def signature_valid(self, secret: str, tolerance: float = 300, now: float | None = None) -> bool:
        # The README's verification, written out here so the test does not trust the code it checks.
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


class WebhookReceiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.fail_next = 0  # answer this many requests with 500 before accepting
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    status = 500 if receiver.fail_next > 0 else 200
                    if status == 500:
                        receiver.fail_next -= 1
                    headers = {key.lower(): value for key, value in self.headers.items()}
                    receiver.requests.append(Received(headers, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def accepted(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.answered == 200]

    def all(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
