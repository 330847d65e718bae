"""Production topologies on one machine, for the fault campaign and the acceptance tests.

- ``PgBouncer``: Debian's pgbouncer in front of a PostgreSQL server, ``pool_mode = transaction`` by default, as
  Django services run it at scale: every transaction may get another server session.

Each runs as a ``Child`` of the caller (its own process group, its log in the caller's log directory), on free ports,
with its files in a directory of its own; ``stop()`` ends only what it started.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from chaos.processes import Child, DeploymentError, free_port, wait_until

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# Debian's pgbouncer refuses to run as root; it drops to this user.
SERVICE_USER = "postgres"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _owned_by_service_user(path: Path) -> None:
    """Make ``path`` readable and writable by the service user when we are root (pgbouncer, postgres drop to it)."""
    if os.geteuid() == 0:
        shutil.chown(path, user=SERVICE_USER, group=None)


class PgBouncer:
    """A private pgbouncer on a free port forwarding every database to ``server_url``'s server."""

    def __init__(self, log_dir: Path, server_url: str, *, pool_mode: str = "transaction", pool_size: int = 10) -> None:
        if not os.path.exists(PGBOUNCER):
            raise DeploymentError("pgbouncer is not installed (Debian package pgbouncer)")
        server = urlsplit(server_url)
        self.server_host = server.hostname or "127.0.0.1"
        self.server_port = server.port or 5432
        self.user = server.username or "postgres"
        self.port = free_port()
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.log_dir = log_dir
        self.directory = log_dir / f"pgbouncer-{self.port}"
        self.child: Child | None = None
        self.starts = 0

    def url(self, server_url: str) -> str:
        """``server_url`` (any database) reached through this pgbouncer instead."""
        parts = urlsplit(server_url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit((parts.scheme, f"{user}127.0.0.1:{self.port}", parts.path, parts.query, ""))

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        _owned_by_service_user(self.directory)
        users = self.directory / "userlist.txt"
        users.write_text(f'"{self.user}" ""\n')
        config = self.directory / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server_host} port={self.server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    f"unix_socket_dir = {self.directory}",
                    "auth_type = trust",
                    f"auth_file = {users}",
                    f"pool_mode = {self.pool_mode}",
                    f"default_pool_size = {self.pool_size}",
                    "max_client_conn = 500",
                    # Django reads these at connect; the rest of a client's startup packet is refused by default.
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"admin_users = {self.user}",
                    "server_check_delay = 1",
                    # A restarted server: give up on a dead server connection quickly and try again.
                    "server_connect_timeout = 3",
                    "server_login_retry = 1",
                    "",
                ]
            )
        )
        for path in (users, config):
            _owned_by_service_user(path)
        return config

    def start(self) -> None:
        config = self._write_config()
        argv = [PGBOUNCER, str(config)]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", SERVICE_USER]
        self.starts += 1
        self.child = Child(f"pgbouncer-{self.starts}", argv, dict(os.environ), self.log_dir)

        def ready() -> bool:
            if not self.child.alive():
                raise DeploymentError(f"pgbouncer exited:\n{self.child.tail()}")
            return _accepts(self.port)

        wait_until(ready, 15, f"pgbouncer on port {self.port}")

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None
