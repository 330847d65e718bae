"""Connections to a Sentinel-managed Redis primary that drop a reply interrupted half-way.

redis-py's plain ``Connection`` disconnects when a read is interrupted
(``disconnect_on_error=True``); its ``SentinelManagedConnection`` does not.
An idle RQ worker waits in a blocking ``BLPOP``; on SIGTERM its handler
raises out of that read, and the worker's shutdown then sends its own
commands on the same connection, where the first reply it reads is the
``BLPOP``'s, due only when that wait times out: the worker hung for minutes
instead of exiting. These classes keep the plain connection's behaviour: a
read that did not finish closes the connection, and the next command
connects again (asking Sentinel for the primary, as after a failover).
"""

from __future__ import annotations

from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

_NOT_GIVEN = object()


class _DisconnectOnInterruptedRead:
    def read_response(self, disable_decoding=False, *, timeout=_NOT_GIVEN, disconnect_on_error=True, **kwargs):
        if timeout is not _NOT_GIVEN:
            kwargs["timeout"] = timeout
        return super().read_response(disable_decoding, disconnect_on_error=disconnect_on_error, **kwargs)


class SentinelConnection(_DisconnectOnInterruptedRead, SentinelManagedConnection):
    pass


class SentinelSSLConnection(_DisconnectOnInterruptedRead, SentinelManagedSSLConnection):
    pass
