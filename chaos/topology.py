"""Production topologies on one machine, for the fault campaign and the acceptance tests.

- ``PgBouncer``: Debian's pgbouncer in front of a PostgreSQL server, ``pool_mode = transaction`` by default, as
  Django services run it at scale: every transaction may get another server session.
- ``SentinelRedis``: a Redis primary, one replica and three Sentinels; the primary may be killed, Sentinel promotes
  the replica, and the old primary comes back as a replica of the new one.
- ``PostgresCluster``: a throwaway PostgreSQL cluster (``initdb``) that may be restarted, so a campaign never
  touches the machine's own server.

Each runs as a ``Child`` of the caller (its own process group, its log in the caller's log directory), on free ports,
with its files in a directory of its own; ``stop()`` ends only what it started.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from chaos.processes import Child, DeploymentError, free_port, free_ports, wait_until
from reliability_console.local_redis import redis_server_argv, redis_server_binary

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


# --- Redis under Sentinel ---------------------------------------------------------------------------------------------

SENTINEL_MASTER = "rc-redis"
SENTINEL_COUNT = 3
# Two of three Sentinels must agree the primary is down; the failover itself needs a majority too.
SENTINEL_QUORUM = 2
# No answer for this long and a Sentinel calls the primary down: short, so a campaign sees the failover mid-run.
SENTINEL_DOWN_AFTER_MS = 1500
# Sentinel waits twice this long before it fails over the same primary again: small, so a later failover can happen.
SENTINEL_FAILOVER_TIMEOUT_MS = 5000


def sentinel_config(*, port: int, directory: Path, master: str, primary_port: int) -> str:
    """One Sentinel's configuration file (Sentinel rewrites it as it learns the replicas and the other Sentinels)."""
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {directory}",
            f"sentinel monitor {master} 127.0.0.1 {primary_port} {SENTINEL_QUORUM}",
            f"sentinel down-after-milliseconds {master} {SENTINEL_DOWN_AFTER_MS}",
            f"sentinel failover-timeout {master} {SENTINEL_FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {master} 1",
            "",
        ]
    )


def redis_node_argv(port: int, directory: Path, *, replica_of: int | None = None) -> list[str]:
    """A data node: the project's redis-server (nothing saved), full syncs streamed without touching the disk."""
    argv = redis_server_argv(port, str(directory))
    # A node that finds a dump.rdb loads it at start: with both set, no node ever writes one.
    argv += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--repl-diskless-load", "swapdb"]
    if replica_of is not None:
        argv += ["--replicaof", "127.0.0.1", str(replica_of)]
    return argv


def _ask(port: int, command: str, *args):
    """One redis-py command to the server on ``port``; None when it does not answer (down, starting, refusing)."""
    import redis

    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1) as client:
        try:
            return getattr(client, command)(*args)
        except (redis.RedisError, OSError):
            return None


class SentinelRedis:
    """A Redis primary, one replica (``--replicaof``) and three Sentinels, each a ``Child`` on a free port."""

    def __init__(self, log_dir: Path, *, master: str = SENTINEL_MASTER) -> None:
        self.log_dir = log_dir
        self.master = master
        self.directory = log_dir / "sentinel-redis"
        ports = free_ports(2 + SENTINEL_COUNT)
        # The first data node starts as the primary, the second as its replica; after a failover they swap.
        self.node_ports, self.sentinel_ports = ports[:2], ports[2:]
        self.nodes: dict[int, Child] = {}
        self.sentinels: list[Child] = []
        self._starts = itertools.count(1)

    def env(self) -> dict[str, str]:
        """The settings that point a process at the primary Sentinel names (REDIS_URL gives only the database)."""
        return {
            "REDIS_SENTINELS": ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports),
            "REDIS_SENTINEL_MASTER": self.master,
            "REDIS_URL": f"redis://127.0.0.1:{self.node_ports[0]}/0",
        }

    def describe(self) -> str:
        return f"Redis primary on port {self.primary_port()} (Sentinel: 1 replica, {SENTINEL_COUNT} sentinels)"

    # -- start and stop -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        primary, replica = self.node_ports
        self._start_node(primary)
        self._start_node(replica, replica_of=primary)
        self._wait_replica_linked(replica)
        for number, port in enumerate(self.sentinel_ports, start=1):
            directory = self.directory / f"sentinel-{port}"
            directory.mkdir(exist_ok=True)
            config = directory / "sentinel.conf"
            config.write_text(sentinel_config(port=port, directory=directory, master=self.master, primary_port=primary))
            argv = [redis_server_binary(), str(config), "--sentinel"]
            self.sentinels.append(Child(f"sentinel-{number}", argv, dict(os.environ), self.log_dir))
        # A failover needs Sentinels that know the replica and each other (they meet through the primary).
        wait_until(self._sentinels_acquainted, 30, "the Sentinels to find the replica and each other", interval=0.2)

    def stop(self) -> None:
        for child in [*self.sentinels, *self.nodes.values()]:
            child.stop()
        self.sentinels, self.nodes = [], {}

    def _start_node(self, port: int, *, replica_of: int | None = None) -> None:
        directory = self.directory / f"node-{port}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "dump.rdb").unlink(missing_ok=True)
        argv = redis_node_argv(port, directory, replica_of=replica_of)
        child = Child(f"redis-{port}-{next(self._starts)}", argv, dict(os.environ), self.log_dir)
        self.nodes[port] = child

        def ready() -> bool:
            if not child.alive():
                raise DeploymentError(f"redis-server on port {port} exited:\n{child.tail()}")
            return bool(_ask(port, "ping"))

        wait_until(ready, 15, f"redis-server on port {port}")

    def _wait_replica_linked(self, port: int) -> None:
        wait_until(
            lambda: (_ask(port, "info", "replication") or {}).get("master_link_status") == "up",
            30,
            f"the replica on port {port} to sync",
        )

    def _sentinels_acquainted(self) -> bool:
        for port in self.sentinel_ports:
            state = _ask(port, "sentinel_master", self.master)
            if not state or state["num-slaves"] < 1 or state["num-other-sentinels"] < SENTINEL_COUNT - 1:
                return False
        return True

    # -- the primary ----------------------------------------------------------------------------------------------

    def _named_primaries(self) -> list[int | None]:
        """The primary's port as each Sentinel names it now (None: no answer)."""
        addresses = [_ask(port, "sentinel_get_master_addr_by_name", self.master) for port in self.sentinel_ports]
        return [int(address[1]) if address else None for address in addresses]

    def primary_port(self) -> int:
        """The primary's port, asked from the Sentinels (the first that answers)."""
        for port in self._named_primaries():
            if port is not None:
                return port
        raise DeploymentError("no Sentinel names a primary")

    def kill_primary(self) -> int:
        """SIGKILL the current primary; returns its port."""
        port = self.primary_port()
        child = self.nodes[port]
        child.signal(signal.SIGKILL)
        child.process.wait()
        return port

    def wait_promoted(self, old_port: int, timeout: float = 30.0) -> int:
        """Wait until every Sentinel names another primary and it answers as one; returns its port."""

        def promoted() -> int | None:
            named = set(self._named_primaries())
            if len(named) != 1 or None in named or old_port in named:
                return None
            (port,) = named
            role = _ask(port, "execute_command", "ROLE")
            return port if role and role[0] in (b"master", "master") else None

        return wait_until(promoted, timeout, f"Sentinel to promote a replica after the primary on {old_port}", 0.1)

    def rejoin(self, port: int) -> None:
        """Start the node on ``port`` again as a replica of the current primary (Sentinel keeps it there)."""
        self.nodes[port].stop()
        self._start_node(port, replica_of=self.primary_port())
        self._wait_replica_linked(port)

    def failover(self, timeout: float = 30.0) -> tuple[int, int]:
        """Kill the primary, let Sentinel promote its replica, bring the old one back as a replica: (old, new) ports."""
        old = self.kill_primary()
        new = self.wait_promoted(old, timeout)
        self.rejoin(old)
        return old, new

    # -- the faults a single Redis also has -----------------------------------------------------------------------

    def restart(self) -> None:
        """Stop the primary and start it again at once, empty (it keeps nothing): shorter than Sentinel's patience."""
        port = self.primary_port()
        self.nodes[port].stop()
        self._start_node(port)

    def flushall(self) -> None:
        if not _ask(self.primary_port(), "flushall"):
            raise DeploymentError("redis FLUSHALL was refused")


# --- a throwaway PostgreSQL cluster -----------------------------------------------------------------------------------

# Sessions: gunicorn's 2 × 16 threads, 4 workers and their heartbeat threads, replacements of killed workers whose
# sessions the server has not reaped yet, the sweeper, the campaign's own threads; behind pgbouncer far fewer.
PG_MAX_CONNECTIONS = 150
# pg_ctl's shutdown modes as the signals the postmaster takes for them.
PG_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def postgres_bindir() -> Path:
    """Where initdb and postgres are: on PATH, else Debian's newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = [path.parent for path in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if not versions:
        raise DeploymentError("no PostgreSQL server programs (initdb, postgres) found: install postgresql")
    return max(versions, key=lambda bindir: int(bindir.parent.name) if bindir.parent.name.isdigit() else 0)


def postgres_options(port: int, *, max_connections: int = PG_MAX_CONNECTIONS) -> list[str]:
    """The server's settings on its command line: TCP on 127.0.0.1 only, and no durability (a throwaway cluster)."""
    settings = {
        "port": port,
        "listen_addresses": "127.0.0.1",
        # No socket file: a run directory's path may be longer than a socket path may be.
        "unix_socket_directories": "",
        "max_connections": max_connections,
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "timezone": "UTC",
    }
    return [option for name, value in settings.items() for option in ("-c", f"{name}={value}")]


class PostgresCluster:
    """A PostgreSQL cluster of the caller's own, on a free port, trust auth, user postgres.

    Its data directory is a new one in the system's temporary directory unless ``directory`` is given: as root
    the server runs as the service user, who may not reach into the caller's directories (pytest's are 0700).
    """

    def __init__(self, log_dir: Path, *, directory: Path | None = None, max_connections: int = PG_MAX_CONNECTIONS):
        self.bindir = postgres_bindir()
        self.directory = directory or Path(tempfile.mkdtemp(prefix="rc-chaos-postgres-"))
        self.log_dir = log_dir
        self.port = free_port()
        self.max_connections = max_connections
        # initdb and postgres refuse to run as root.
        self.user = SERVICE_USER if os.geteuid() == 0 else None
        self.child: Child | None = None
        self.restarts = 0
        self._starts = itertools.count(1)

    @property
    def url(self) -> str:
        """The server's URL, without a database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def start(self) -> None:
        if not (self.directory / "PG_VERSION").exists():
            self._initdb()
        argv = [str(self.bindir / "postgres"), "-D", str(self.directory), *postgres_options(self.port)]
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        self.child = Child(f"postgres-{next(self._starts)}", argv, env, self.log_dir, user=self.user)
        wait_until(self._accepts, 60, f"PostgreSQL on port {self.port}", interval=0.2)

    def _initdb(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        _owned_by_service_user(self.directory)
        argv = [str(self.bindir / "initdb"), "-D", str(self.directory), "-U", "postgres", "--auth=trust"]
        argv += ["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"]
        as_user = {"user": self.user, "group": self.user, "extra_groups": []} if self.user else {}
        with open(self.log_dir / "initdb.log", "ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False, **as_user)
        if done.returncode != 0:
            raise DeploymentError(f"initdb failed (exit {done.returncode}): see {self.log_dir / 'initdb.log'}")

    def _accepts(self) -> bool:
        if self.child is None or not self.child.alive():
            tail = self.child.tail() if self.child else ""
            raise DeploymentError(f"postgres exited:\n{tail}")
        from devtools import postgres

        try:
            postgres.connect(f"{self.url}/postgres", connect_timeout=2).close()
        except postgres.OperationalError:
            return False
        return True

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down as ``pg_ctl stop -m mode`` does (fast: every session ended, a clean checkpoint)."""
        if self.child is None:
            return
        child, self.child = self.child, None
        child.signal(PG_SHUTDOWN_SIGNALS[mode])
        try:
            child.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.signal(signal.SIGKILL)
        child.stop()

    def restart(self, mode: str = "fast", *, down_seconds: float = 0.0) -> None:
        """Stop the server (every connection drops), stay down ``down_seconds``, start it again."""
        self.stop(mode)
        time.sleep(down_seconds)  # the fault itself: clients meet a server that is not there
        self.start()
        self.restarts += 1

    def remove(self) -> None:
        """Stop the server and delete the cluster."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
