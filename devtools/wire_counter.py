"""A TCP relay on 127.0.0.1 that counts what its clients ask a PostgreSQL or Redis server: round trips, and more.

A process under test is pointed at the relay instead of the server. Every
byte passes unchanged; on the way the relay counts, per connection, each
time the client speaks after the server did (a round trip: a synchronous
client waits for the answer before it asks again, so a pipeline of Redis
commands or one PostgreSQL statement is one). For PostgreSQL it also reads
the server's ReadyForQuery messages: each that says "idle" after a query
ended a transaction (committed or read-only, as ``pg_stat_database``'s
``xact_commit`` counts them). For Redis it names the commands of each round
trip. The figures are the server's conversation, not times: the same code
gives the same counts, whatever the machine's load.

PostgreSQL clients must not negotiate TLS or GSS encryption
(``sslmode=disable&gssencmode=disable``), or there is nothing to read.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

POSTGRES = "postgres"
REDIS = "redis"


@dataclass
class Counts:
    """What the relay's clients asked, summed over every connection since the relay started."""

    connections: int = 0
    round_trips: int = 0
    # PostgreSQL: transactions ended (ReadyForQuery "idle" after a query) and the statements' texts.
    transactions: int = 0
    statements: list[str] = field(default_factory=list)
    # Redis: the commands of each round trip, e.g. ("HSET", "EXPIRE", "EXPIRE") for an unpipelined heartbeat.
    turns: list[tuple[str, ...]] = field(default_factory=list)

    def copy(self) -> Counts:
        return Counts(self.connections, self.round_trips, self.transactions, list(self.statements), list(self.turns))

    def since(self, earlier: Counts) -> Counts:
        """What was asked after ``earlier`` (a copy taken from this relay before)."""
        return Counts(
            self.connections - earlier.connections,
            self.round_trips - earlier.round_trips,
            self.transactions - earlier.transactions,
            self.statements[len(earlier.statements) :],
            self.turns[len(earlier.turns) :],
        )

    def commands(self) -> Counter:
        return Counter(command for turn in self.turns for command in turn)


class WireCounter:
    """Relays 127.0.0.1:<port> to ``target`` and counts the conversation; ``protocol`` is POSTGRES or REDIS."""

    def __init__(self, target_host: str, target_port: int, protocol: str) -> None:
        if protocol not in (POSTGRES, REDIS):
            raise ValueError(f"unknown protocol {protocol!r}")
        self.target = (target_host, int(target_port))
        self.protocol = protocol
        self._lock = threading.Lock()
        self._counts = Counts()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="wire-accept", daemon=True).start()

    def counts(self) -> Counts:
        with self._lock:
            return self._counts.copy()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> WireCounter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- relaying ---------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conversation = _Conversation(self.protocol)
            with self._lock:
                self._sockets += [client, server]
                self._counts.connections += 1
            threading.Thread(target=self._pump, args=(client, server, conversation, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conversation, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, conversation: _Conversation, from_client: bool):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                # Counted before it is passed on: the answer cannot reach the client, and the client cannot
                # ask again, before the count of what came before it.
                with self._lock:
                    conversation.heard(data, from_client, self._counts)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Conversation:
    """One connection's state: who spoke last, and what is left of a message split across reads."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.client_spoke_last = False
        self.client_buffer = b""
        self.server_buffer = b""
        self.startup_done = False  # PostgreSQL: the first client message has no type byte
        self.queried = False  # PostgreSQL: the ReadyForQuery that ends the start-up is not a transaction

    def heard(self, data: bytes, from_client: bool, counts: Counts) -> None:
        if from_client:
            if not self.client_spoke_last:
                counts.round_trips += 1
                if self.protocol == REDIS:
                    counts.turns.append(())
            self.client_spoke_last = True
            self.client_buffer += data
            if self.protocol == POSTGRES:
                self._client_postgres(counts)
            else:
                self._client_redis(counts)
        else:
            self.client_spoke_last = False
            if self.protocol == POSTGRES:
                self.server_buffer += data
                self._server_postgres(counts)

    def _client_postgres(self, counts: Counts) -> None:
        buffer = self.client_buffer
        while True:
            if not self.startup_done:
                if len(buffer) < 4:
                    break
                (length,) = struct.unpack("!I", buffer[:4])
                if len(buffer) < length:
                    break
                buffer = buffer[length:]
                self.startup_done = True
                continue
            if len(buffer) < 5:
                break
            kind = buffer[:1]
            (length,) = struct.unpack("!I", buffer[1:5])
            if len(buffer) < 1 + length:
                break
            body = buffer[5 : 1 + length]
            buffer = buffer[1 + length :]
            if kind == b"Q":
                counts.statements.append(body.rstrip(b"\0").decode("utf-8", "replace"))
                self.queried = True
            elif kind == b"P":  # Parse (the extended protocol): name\0query\0...
                counts.statements.append(body.split(b"\0")[1].decode("utf-8", "replace"))
                self.queried = True
        self.client_buffer = buffer

    def _server_postgres(self, counts: Counts) -> None:
        buffer = self.server_buffer
        while len(buffer) >= 5:
            kind = buffer[:1]
            (length,) = struct.unpack("!I", buffer[1:5])
            if len(buffer) < 1 + length:
                break
            if kind == b"Z" and buffer[5:6] == b"I" and self.queried:
                counts.transactions += 1
            buffer = buffer[1 + length :]
        self.server_buffer = buffer

    def _client_redis(self, counts: Counts) -> None:
        buffer = self.client_buffer
        while buffer:
            command, buffer_left = _resp_command(buffer)
            if command is None:
                break
            buffer = buffer_left
            counts.turns[-1] = (*counts.turns[-1], command)
        self.client_buffer = buffer


def _resp_command(buffer: bytes) -> tuple[str | None, bytes]:
    """The name of the first complete RESP command in ``buffer`` and what follows it; (None, buffer) if partial."""
    if not buffer.startswith(b"*"):
        # An inline command (redis-cli's, never redis-py's): one line.
        line, found, rest = buffer.partition(b"\r\n")
        return (line.split(b" ")[0].decode().upper(), rest) if found else (None, buffer)
    line, found, rest = buffer.partition(b"\r\n")
    if not found:
        return None, buffer
    arguments = []
    for _ in range(int(line[1:])):
        header, found, rest = rest.partition(b"\r\n")
        if not found or not header.startswith(b"$"):
            return None, buffer
        size = int(header[1:])
        if len(rest) < size + 2:
            return None, buffer
        arguments.append(rest[:size])
        rest = rest[size + 2 :]
    return (arguments[0].decode("utf-8", "replace").upper() if arguments else ""), rest
