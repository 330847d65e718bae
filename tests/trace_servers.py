"""Real servers on 127.0.0.1 for the tracing tests: an OTLP/HTTP receiver that decodes the spans processes export,
and a remote API that answers from a script and records the ``traceparent`` of every call."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as an exporter sent it, its ids as hex."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str, dict[str, Any]], ...]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_error: bool


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in key_values}


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _serving(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int, threading.Thread]:
    """``handler`` served on a free port of 127.0.0.1 from a daemon thread: the server, its port, the thread."""
    handler.log_message = lambda self, *args: None  # quiet
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, server.server_address[1], thread


class OtlpReceiver:
    """``POST /v1/traces`` (OTLP/HTTP, protobuf, optionally gzip), decoded with ``opentelemetry.proto``."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._received(request)
                _reply(self, 200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

        self.server, self.port, self.thread = _serving(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _received(self, request) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=service,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            attributes=_attributes(span.attributes),
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
                                for link in span.links
                            ),
                            events=tuple((event.name, _attributes(event.attributes)) for event in span.events),
                            status_error=span.status.code == 2,
                        )
                    )
        with self._lock:
            self.spans.extend(spans)

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Call:
    """One request the scripted server received: its headers (lower-case names) and what it answered."""

    headers: dict[str, str]
    answered: int


@dataclass
class ScriptedServer:
    """A remote API that answers its calls in the order of ``script``: a status, or ``"hang"`` (the call waits
    until ``release()``, then gets a 503); past the script, 200."""

    script: list[int | str]
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with server._lock:
                    position = len(server.calls)
                    action = server.script[position] if position < len(server.script) else 200
                    call = Call({name.lower(): value for name, value in self.headers.items()}, 0)
                    server.calls.append(call)
                if action == "hang":
                    server._released.wait(60)
                    action = 503
                call.answered = int(action)
                body = b'{"ok": true}' if action == 200 else b'{"error": "unavailable"}'
                _reply(self, call.answered, body, "application/json")

        self.server, self.port, self.thread = _serving(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/payments/p-1?api_key=not-for-traces"

    def received(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
