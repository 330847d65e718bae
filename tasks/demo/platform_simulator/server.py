"""HTTP plumbing: the threaded server, request framing and body reading, and the response values it writes."""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The package's one logger, named as when the simulator was a single module.
logger = logging.getLogger(__package__)

MAX_BODY_BYTES = 1024 * 1024


@dataclass
class _Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def response(self) -> _Response:
        return _Response(self.status, _error_body(self.code, self.message), dict(self.headers))


def _encode(payload: object) -> bytes:
    return json.dumps(payload).encode()


def _error_body(code: str, message: str) -> bytes:
    return _encode({"error": {"code": code, "message": message}})


def _json_response(status: int, payload: object) -> _Response:
    return _Response(status, _encode(payload))


def _parse_json(raw: bytes) -> tuple[Any, bool]:
    """Return ``(body, ok)``; an empty body is ``(None, True)``."""
    if not raw:
        return None, True
    try:
        return json.loads(raw), True
    except ValueError:  # also covers UnicodeDecodeError
        return None, False


class _BadFraming(Exception):
    pass


# What answers a request (the simulator's ``_handle``): method, target, the headers it reads, body, Host.
_Responder = Callable[[str, str, Mapping[str, str], bytes, str], _Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], respond: _Responder) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.respond = respond
        self._connections: set[socket.socket] = set()
        self._connections_changed = threading.Condition()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can stall for seconds.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("report platform simulator: error serving %s", client_address, exc_info=sys.exc_info())

    def track(self, connection: socket.socket) -> None:
        with self._connections_changed:
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._connections_changed:
            self._connections.discard(connection)
            self._connections_changed.notify_all()

    def close_connections(self, timeout: float) -> None:
        """Shut down open (e.g. idle keep-alive) connections and wait for their threads to finish."""
        with self._connections_changed:
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections_changed.wait_for(lambda: not self._connections, timeout)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ReportPlatformSimulator/1.0"
    timeout = 120  # an idle keep-alive connection must not pin a thread forever
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("report platform simulator: %s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            raw = self._read_body()
        except _BadFraming as exc:
            self._write(_Response(400, _error_body("invalid_body", str(exc)), close=True))
            return
        except OSError:
            self.close_connection = True
            return
        headers = {name: self.headers[name] for name in ("X-Task-Id", "X-Request-Deadline", "Idempotency-Key")}
        headers = {name: value for name, value in headers.items() if value is not None}
        response = self.server.respond(self.command, self.path, headers, raw, self.headers.get("Host", ""))
        self._write(response)

    def _read_body(self) -> bytes:
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise _BadFraming(f"unsupported Transfer-Encoding: {encoding}")
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
        except ValueError:
            raise _BadFraming(f"invalid Content-Length: {length!r}") from None
        if not 0 <= size <= MAX_BODY_BYTES:
            raise _BadFraming(f"Content-Length must be between 0 and {MAX_BODY_BYTES}")
        raw = self.rfile.read(size)
        if len(raw) != size:
            raise _BadFraming("request body shorter than Content-Length")
        return raw

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _BadFraming("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise _BadFraming(f"request body larger than {MAX_BODY_BYTES} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise _BadFraming("truncated chunked body")
            chunks.append(chunk)
            self.rfile.readline(1024)

    def _write(self, response: _Response) -> None:
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            if response.status != 204:  # a 204 carries neither a body nor Content-Length (RFC 9110)
                if response.body:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(response.body)))
            if response.close:
                self.send_header("Connection", "close")
            self.end_headers()
            if response.body and response.status != 204:
                self.wfile.write(response.body)
        except OSError:
            # The client gave up (e.g. timed out on a slow answer); nothing left to tell it.
            self.close_connection = True
