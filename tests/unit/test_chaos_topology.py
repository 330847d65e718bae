"""The campaign's production topologies and their faults: configuration it generates, options it refuses."""

from __future__ import annotations

import pytest

from chaos import faults
from chaos.campaign import CampaignConfig
from chaos.deployment import WEB_PROCESSES, WEB_THREADS
from chaos.invariants import check, format_table
from chaos.topology import (
    PG_MAX_CONNECTIONS,
    SENTINEL_DOWN_AFTER_MS,
    SENTINEL_QUORUM,
    SentinelRedis,
    postgres_options,
    redis_node_argv,
    sentinel_config,
)
from reliability_console.config import redis_connection_config
from tests.unit.test_chaos_invariants import valid_run


def test_a_sentinel_monitors_the_primary_with_a_quorum_of_two_and_fails_over_within_seconds(tmp_path):
    config = sentinel_config(port=26001, directory=tmp_path, master="rc-redis", primary_port=7001).splitlines()
    assert "port 26001" in config
    assert "bind 127.0.0.1" in config
    assert f"dir {tmp_path}" in config
    assert "sentinel monitor rc-redis 127.0.0.1 7001 2" in config
    assert SENTINEL_QUORUM == 2
    (down_after,) = [line for line in config if line.startswith("sentinel down-after-milliseconds rc-redis ")]
    assert 1000 <= int(down_after.split()[-1]) == SENTINEL_DOWN_AFTER_MS <= 2000
    (failover_timeout,) = [line for line in config if line.startswith("sentinel failover-timeout rc-redis ")]
    assert int(failover_timeout.split()[-1]) <= 10_000


def test_redis_nodes_keep_nothing_on_disk_and_only_the_replica_follows(tmp_path):
    primary = redis_node_argv(7001, tmp_path)
    replica = redis_node_argv(7002, tmp_path, replica_of=7001)
    for argv in (primary, replica):
        pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
        assert pairs["--save"] == "" and pairs["--appendonly"] == "no"
        assert pairs["--repl-diskless-sync"] == "yes" and pairs["--repl-diskless-load"] == "swapdb"
    assert "--replicaof" not in primary
    assert replica[-3:] == ["--replicaof", "127.0.0.1", "7001"]


def test_the_sentinel_settings_are_ones_the_project_accepts(tmp_path):
    redis = SentinelRedis(tmp_path)
    env = redis.env()
    sentinels = env["REDIS_SENTINELS"].split(",")
    assert len(set(sentinels)) == 3
    ports = {int(entry.rsplit(":", 1)[1]) for entry in sentinels} | set(redis.node_ports)
    assert len(ports) == 5  # no two parts share a port
    config = redis_connection_config(env["REDIS_URL"], sentinels=sentinels, master=env["REDIS_SENTINEL_MASTER"])
    assert config["MASTER_NAME"] == "rc-redis"
    assert config["DB"] == 0
    assert config["SENTINELS"] == [("127.0.0.1", int(entry.rsplit(":", 1)[1])) for entry in sentinels]


def test_the_throwaway_cluster_listens_on_loopback_only_and_has_room_for_every_session():
    options = postgres_options(54321)
    settings = dict(option.split("=", 1) for option in options[1::2])
    assert set(options[0::2]) == {"-c"}
    assert settings["port"] == "54321"
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["unix_socket_directories"] == ""
    # gunicorn's threads, each worker (and its replacement before the server reaps the dead one's session)
    # with its heartbeat thread, the sweeper, the campaign's own threads.
    sessions = WEB_PROCESSES * WEB_THREADS + 2 * 2 * 4 + 2 + 3
    assert int(settings["max_connections"]) == PG_MAX_CONNECTIONS >= 2 * sessions


def test_all_faults_means_those_the_topology_has_the_parts_for():
    plain = faults.applicable_faults(sentinel=False, own_cluster=False)
    assert "redis-failover" not in plain and "pg-restart" not in plain
    assert set(plain) == set(faults.PLATFORM_FAULTS + faults.PROCESS_FAULTS)
    assert "redis-failover" in faults.applicable_faults(sentinel=True, own_cluster=False)
    assert "pg-restart" in faults.applicable_faults(sentinel=False, own_cluster=True)
    assert faults.applicable_faults(sentinel=True, own_cluster=True) == faults.ALL_FAULTS
    assert CampaignConfig().faults == frozenset(plain)
    assert CampaignConfig(sentinel=True, own_cluster=True).faults == frozenset(faults.ALL_FAULTS)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (CampaignConfig(faults=frozenset({"redis-failover"})), "the fault redis-failover needs --sentinel"),
        (CampaignConfig(faults=frozenset({"pg-restart"}), sentinel=True), "the fault pg-restart needs --own-cluster"),
        (CampaignConfig(own_cluster=True, server_url="postgresql://h:5432"), "leave out --server-url"),
    ],
)
def test_a_fault_without_its_topology_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_the_topology_faults_leave_a_seeds_earlier_schedule_as_it_was():
    earlier = faults.schedule(seed=3, faults=frozenset(faults.PROCESS_FAULTS), window=150)
    now = faults.schedule(seed=3, faults=frozenset(faults.ALL_FAULTS), window=150)
    assert [fault for fault in now if fault.kind not in faults.TOPOLOGY_FAULTS] == earlier
    added = [fault for fault in now if fault.kind in faults.TOPOLOGY_FAULTS]
    assert sorted(fault.kind for fault in added) == ["pg-restart", "redis-failover"]
    for fault in added:
        assert 0.1 * 150 <= fault.at <= 0.8 * 150


def test_the_report_names_the_topology_when_the_record_has_one():
    record = valid_run()
    assert "topology:" not in format_table(record, check(record))
    record["meta"]["topology"] = {"postgresql": "own cluster on port 5", "pooler": "pgbouncer", "redis": "sentinel"}
    table = format_table(record, check(record))
    assert "topology: postgresql own cluster on port 5; pooler pgbouncer; redis sentinel" in table.splitlines()
