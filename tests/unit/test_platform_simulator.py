"""The report platform simulator, exercised over real HTTP on an ephemeral port (no database)."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import pytest

from tasks.demo.platform_simulator import (
    ReportPlatformSimulator,
    SimulatorConfig,
    SimulatorControl,
    SimulatorError,
)

T = TypeVar("T")

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_keys = itertools.count(1)
_OMIT = object()


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str:
        return self.json()["error"]["code"]


def send(
    sim: ReportPlatformSimulator,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    task_id: Any = "task-1",
    key: Any = None,
    deadline_ms: Any = None,
    timeout: float = 5.0,
) -> Reply:
    """One contract call; ``_OMIT`` drops a header, ``key=None`` picks a fresh Idempotency-Key."""
    headers = {
        "X-Task-Id": task_id,
        "X-Request-Deadline": str(int(time.time() * 1000) + 30_000) if deadline_ms is None else deadline_ms,
        "Idempotency-Key": f"key-{next(_keys)}" if key is None else key,
    }
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(sim.url + path, data=data, method=method)
    for name, value in headers.items():
        if value is not _OMIT:
            request.add_header(name, str(value))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        try:
            return Reply(exc.code, exc.headers, exc.read())
        finally:
            exc.close()


def charge(sim: ReportPlatformSimulator, user_id: str = "alice", units: int = 10, **kw: Any) -> Reply:
    return send(sim, "POST", "/v1/quota/charges", {"user_id": user_id, "units": units}, **kw)


def balance(sim: ReportPlatformSimulator, user_id: str = "alice") -> int:
    state = sim.state()
    return state["balances"].get(user_id, state["initial_balance"])


def wait_for(predicate: Callable[[], T], timeout: float = 5.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


@pytest.fixture
def sim() -> Iterator[ReportPlatformSimulator]:
    simulator = ReportPlatformSimulator(SimulatorConfig(port=0)).start()
    try:
        yield simulator
    finally:
        simulator.stop()


# --- endpoints ----------------------------------------------------------------------------------------------------


def test_start_on_port_zero_exposes_port_and_url(sim: ReportPlatformSimulator) -> None:
    assert sim.port > 0
    assert sim.url == f"http://127.0.0.1:{sim.port}"
    assert SimulatorControl(sim.url).health()


def test_charge_deducts_units(sim: ReportPlatformSimulator) -> None:
    reply = charge(sim, units=30)
    assert reply.status == 201
    assert reply.json()["balance"] == 70
    charge_id = reply.json()["charge_id"]
    assert sim.state()["charges"][charge_id] == {
        "user_id": "alice",
        "units": 30,
        "refunded": False,
        "task_id": "task-1",
    }
    [record] = sim.calls()
    assert record["kind"] == "charge" and record["effect"] is True and record["status"] == 201
    assert record["body"] == {"user_id": "alice", "units": 30}
    assert record["fault"] is None and record["replayed"] is False and record["late"] is False
    assert record["received_ms"] <= record["finished_ms"]


def test_refund_twice_changes_balance_once(sim: ReportPlatformSimulator) -> None:
    charge_id = charge(sim, units=30).json()["charge_id"]
    first = send(sim, "POST", f"/v1/quota/charges/{charge_id}/refund", {})
    second = send(sim, "POST", f"/v1/quota/charges/{charge_id}/refund", {})
    assert (first.status, first.json()) == (200, {"balance": 100})
    assert (second.status, second.json()) == (200, {"balance": 100})
    assert "Idempotent-Replayed" not in second.headers  # a different key: answered, just without effect
    assert [c["effect"] for c in sim.calls() if c["kind"] == "refund"] == [True, False]
    assert sim.state()["charges"][charge_id]["refunded"] is True
    assert balance(sim) == 100


def test_refund_of_unknown_charge_is_404(sim: ReportPlatformSimulator) -> None:
    reply = send(sim, "POST", "/v1/quota/charges/ch_nope/refund", {})
    assert reply.status == 404
    assert reply.code == "charge_not_found"


def test_report_mentions_topic(sim: ReportPlatformSimulator) -> None:
    reply = send(sim, "POST", "/v1/reports", {"user_id": "alice", "topic": "latency"})
    assert reply.status == 200
    assert "latency" in reply.json()["text"]
    [report] = sim.state()["reports"]
    assert report["report_id"] == reply.json()["report_id"]
    assert report["task_id"] == "task-1"


def test_file_put_then_delete_then_404(sim: ReportPlatformSimulator) -> None:
    put = send(sim, "PUT", "/v1/files/report-1.txt", {"content": "hello"})
    assert put.status == 201
    assert put.json() == {"url": f"{sim.url}/v1/files/report-1.txt"}
    assert sim.state()["files"] == {"report-1.txt": {"content": "hello", "task_id": "task-1"}}

    deleted = send(sim, "DELETE", "/v1/files/report-1.txt", key="del-1")
    assert (deleted.status, deleted.body) == (204, b"")
    assert sim.state()["files"] == {}

    gone = send(sim, "DELETE", "/v1/files/report-1.txt")
    assert gone.status == 404
    assert gone.code == "file_not_found"

    replay = send(sim, "DELETE", "/v1/files/report-1.txt", key="del-1")
    assert (replay.status, replay.body, replay.headers["Idempotent-Replayed"]) == (204, b"", "true")


def test_notification_is_accepted(sim: ReportPlatformSimulator) -> None:
    reply = send(sim, "POST", "/v1/notifications", {"user_id": "alice", "message": "your report is ready"})
    assert reply.status == 202
    [notification] = sim.state()["notifications"]
    assert notification["notification_id"] == reply.json()["notification_id"]
    assert notification["message"] == "your report is ready"


def test_work_takes_the_time_asked_and_records_when_it_began_and_ended(sim: ReportPlatformSimulator) -> None:
    reply = send(sim, "POST", "/v1/work", {"ms": 150})
    assert reply.status == 200
    [work] = sim.state()["work"]
    assert reply.json() == {"work_id": work["work_id"], "ms": 150}
    assert (work["task_id"], work["ms"]) == ("task-1", 150)
    assert work["finished_ms"] - work["received_ms"] >= 150
    [record] = sim.calls()
    assert (record["kind"], record["effect"], record["received_ms"]) == ("work", True, work["received_ms"])
    assert record["finished_ms"] >= work["finished_ms"]


def test_work_in_flight_is_in_the_state_and_calls_overlap(sim: ReportPlatformSimulator) -> None:
    threads = [threading.Thread(target=send, args=(sim, "POST", "/v1/work", {"ms": 400})) for _ in range(3)]
    for thread in threads:
        thread.start()
    in_flight = wait_for(lambda: [w for w in sim.state()["work"] if w["finished_ms"] is None] or None)
    assert in_flight[0]["ms"] == 400 and sim.calls() == []  # a call is recorded when it is answered
    for thread in threads:
        thread.join(10)
    work = sim.state()["work"]
    assert len(work) == 3 and all(w["finished_ms"] is not None for w in work)
    # Served by a thread each: all three were under way at once.
    assert max(w["received_ms"] for w in work) < min(w["finished_ms"] for w in work)


def test_a_replayed_work_call_does_no_work_again(sim: ReportPlatformSimulator) -> None:
    first = send(sim, "POST", "/v1/work", {"ms": 50}, key="w-1")
    second = send(sim, "POST", "/v1/work", {"ms": 50}, key="w-1")
    assert second.body == first.body and second.headers["Idempotent-Replayed"] == "true"
    assert len(sim.state()["work"]) == 1
    assert [(c["replayed"], c["effect"]) for c in sim.calls()] == [(False, True), (True, False)]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{}", "missing_field"),
        (b'{"ms": -1}', "invalid_field"),
        (b'{"ms": 600001}', "invalid_field"),
        (b'{"ms": 1.5}', "invalid_field"),
        (b'{"ms": true}', "invalid_field"),
    ],
)
def test_bad_work_bodies_are_400(sim: ReportPlatformSimulator, raw: bytes, code: str) -> None:
    reply = send(sim, "POST", "/v1/work", raw=raw)
    assert (reply.status, reply.code) == (400, code)
    assert sim.state()["work"] == []


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/nothing", 404),
        ("GET", "/v1/reports", 405),
        ("POST", "/v1/files/a", 405),
        ("GET", "/v1/work", 405),
        ("GET", "/other", 404),
    ],
)
def test_unknown_routes(sim: ReportPlatformSimulator, method: str, path: str, status: int) -> None:
    assert send(sim, method, path, {} if method == "POST" else None).status == status


# --- idempotency --------------------------------------------------------------------------------------------------


def test_replay_is_byte_identical_without_second_effect(sim: ReportPlatformSimulator) -> None:
    first = charge(sim, units=25, key="k-1")
    second = charge(sim, units=25, key="k-1")
    assert first.status == second.status == 201
    assert second.body == first.body
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert balance(sim) == 75
    assert len(sim.state()["charges"]) == 1
    assert [(c["replayed"], c["effect"]) for c in sim.calls()] == [(False, True), (True, False)]


def test_business_refusal_is_replayed_too(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(insufficient_users=["bob"])
    first = charge(sim, user_id="bob", key="refused")
    sim.set_faults(insufficient_users=[])
    second = charge(sim, user_id="bob", key="refused")
    assert first.status == second.status == 402
    assert second.body == first.body
    assert second.headers["Idempotent-Replayed"] == "true"
    assert charge(sim, user_id="bob").status == 201


def test_key_reuse_with_different_body_is_422(sim: ReportPlatformSimulator) -> None:
    assert charge(sim, units=10, key="k-1").status == 201
    reused = charge(sim, units=20, key="k-1")
    assert reused.status == 422
    assert reused.code == "idempotency_key_reused"
    assert balance(sim) == 90
    assert sim.calls()[-1]["effect"] is False


def test_key_reuse_on_another_endpoint_is_422(sim: ReportPlatformSimulator) -> None:
    assert charge(sim, key="k-1").status == 201
    reused = send(sim, "POST", "/v1/notifications", {"user_id": "alice", "message": "hi"}, key="k-1")
    assert reused.status == 422
    assert sim.state()["notifications"] == []


# --- deadlines, quota, validation ---------------------------------------------------------------------------------


def test_late_call_is_504_without_effect_and_recorded_late(sim: ReportPlatformSimulator) -> None:
    reply = charge(sim, deadline_ms=int(time.time() * 1000) - 1_000)
    assert reply.status == 504
    assert reply.code == "deadline_exceeded"
    assert balance(sim) == 100
    [record] = sim.calls()
    assert record["late"] is True and record["effect"] is False and record["status"] == 504


def test_insufficient_user_always_gets_402(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(insufficient_users=["bob"])
    reply = charge(sim, user_id="bob", units=1)
    assert reply.status == 402
    assert reply.code == "insufficient_quota"
    assert sim.state()["charges"] == {}
    assert charge(sim, user_id="alice", units=1).status == 201


def test_exhausted_balance_gets_402(sim: ReportPlatformSimulator) -> None:
    assert charge(sim, units=60).json()["balance"] == 40
    refused = charge(sim, units=50)
    assert refused.status == 402
    assert refused.code == "insufficient_quota"
    assert balance(sim) == 40


def test_initial_balance_is_configurable() -> None:
    with ReportPlatformSimulator(SimulatorConfig(initial_balance=5)) as simulator:
        assert charge(simulator, units=6).status == 402
        assert charge(simulator, units=5).json()["balance"] == 0


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"task_id": _OMIT}, "missing_task_id"),
        ({"deadline_ms": _OMIT}, "missing_deadline"),
        ({"deadline_ms": "soon"}, "invalid_deadline"),
        ({"key": _OMIT}, "missing_idempotency_key"),
    ],
)
def test_missing_or_bad_headers_are_400(sim: ReportPlatformSimulator, overrides: dict[str, Any], code: str) -> None:
    reply = charge(sim, **overrides)
    assert reply.status == 400
    assert reply.code == code
    assert sim.state()["charges"] == {}
    assert sim.calls()[0]["effect"] is False


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[1, 2]", "invalid_body"),
        (b'{"user_id": "alice"}', "missing_field"),
        (b'{"user_id": "alice", "units": "10"}', "invalid_field"),
        (b'{"user_id": "alice", "units": 0}', "invalid_field"),
        (b'{"user_id": "alice", "units": true}', "invalid_field"),
        (b'{"user_id": 7, "units": 1}', "invalid_field"),
    ],
)
def test_bad_bodies_are_400(sim: ReportPlatformSimulator, raw: bytes, code: str) -> None:
    reply = send(sim, "POST", "/v1/quota/charges", raw=raw)
    assert reply.status == 400
    assert reply.code == code
    assert sim.state()["charges"] == {}


def test_a_rejected_body_does_not_burn_its_key(sim: ReportPlatformSimulator) -> None:
    assert send(sim, "POST", "/v1/quota/charges", raw=b"{oops", key="k-1").status == 400
    assert charge(sim, key="k-1").status == 201


# --- scripted faults ----------------------------------------------------------------------------------------------


def test_scripted_503_then_success_with_the_same_key(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(rules=[{"path_prefix": "/v1/reports", "status": 503}])
    body = {"user_id": "alice", "topic": "errors"}
    failed = send(sim, "POST", "/v1/reports", body, key="r-1")
    assert failed.status == 503
    assert failed.code == "service_unavailable"
    assert sim.state()["reports"] == []
    retried = send(sim, "POST", "/v1/reports", body, key="r-1")
    assert retried.status == 200
    assert "Idempotent-Replayed" not in retried.headers  # the fault was not stored
    assert len(sim.state()["reports"]) == 1
    assert [c["fault"] for c in sim.calls()] == ["scripted:503", None]
    assert sim.faults()["rules"] == []


def test_scripted_429_carries_retry_after(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(rules=[{"method": "POST", "status": 429, "retry_after": 2, "times": 2}])
    for _ in range(2):
        throttled = charge(sim, key="c-1")
        assert throttled.status == 429
        assert throttled.headers["Retry-After"] == "2"
        assert throttled.code == "rate_limited"
    assert balance(sim) == 100
    assert charge(sim, key="c-1").status == 201


def test_scripted_retry_after_as_an_http_date_on_any_status(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(rules=[{"status": 503, "retry_after": 2, "retry_after_http_date": True, "times": 1}])
    before = time.time()
    unavailable = charge(sim, key="c-1")
    assert unavailable.status == 503
    moment = parsedate_to_datetime(unavailable.headers["Retry-After"]).timestamp()
    assert unavailable.headers["Retry-After"].endswith(" GMT")
    assert before + 2 <= moment <= time.time() + 3
    with pytest.raises(ValueError, match="retry_after_http_date"):
        sim.set_faults(rules=[{"status": 429, "retry_after_http_date": "yes"}])


def test_rules_match_on_task_and_user_and_apply_in_order(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(
        rules=[
            {"task_id": "task-2", "status": 409},
            {"user_id": "bob", "status": 500, "code": "boom", "message": "kaboom"},
            {"method": "DELETE", "status": 502},
        ]
    )
    assert charge(sim, user_id="alice").status == 201  # no rule matches task-1 / alice / POST
    bob = charge(sim, user_id="bob")
    assert (bob.status, bob.json()) == (500, {"error": {"code": "boom", "message": "kaboom"}})
    assert charge(sim, user_id="bob", task_id="task-2").status == 409
    assert send(sim, "DELETE", "/v1/files/x").status == 502
    assert send(sim, "DELETE", "/v1/files/x").status == 404
    assert charge(sim, user_id="bob", task_id="task-2").status == 201


def test_slow_answer_times_out_the_client_but_the_retry_is_replayed(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(rules=[{"path_prefix": "/v1/quota", "slow": 30}])
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        charge(sim, units=10, key="slow-1", timeout=0.5)
    [charge_id] = wait_for(lambda: list(sim.state()["charges"]))  # the effect happened before the delay

    retried = charge(sim, units=10, key="slow-1")
    assert retried.status == 201
    assert retried.headers["Idempotent-Replayed"] == "true"
    assert retried.json() == {"charge_id": charge_id, "balance": 90}
    assert balance(sim) == 90
    assert [(c["fault"], c["effect"], c["replayed"]) for c in sim.calls()] == [
        ("scripted:slow", True, False),
        (None, False, True),
    ]


def test_hang_blocks_before_processing(sim: ReportPlatformSimulator) -> None:
    sim.set_faults(rules=[{"path_prefix": "/v1/quota", "hang": 2}])
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        charge(sim, units=10, key="hang-1", timeout=0.3)
    assert sim.state()["charges"] == {}  # still hanging: nothing processed yet

    retried = charge(sim, units=10, key="hang-1")
    assert retried.status == 201
    assert "Idempotent-Replayed" not in retried.headers

    hung = wait_for(lambda: [c for c in sim.calls() if c["fault"] == "scripted:hang"])
    assert (hung[0]["replayed"], hung[0]["effect"], hung[0]["status"]) == (True, False, 201)
    assert balance(sim) == 90
    assert len(sim.state()["charges"]) == 1


def test_invalid_fault_settings_are_refused(sim: ReportPlatformSimulator) -> None:
    for bad in ({"fail_rate": 1.5}, {"slow_seconds": -1}, {"bogus": 1}, {"rules": [{"status": 200}]}):
        with pytest.raises((ValueError, TypeError)):
            sim.set_faults(**bad)
    assert sim.faults()["fail_rate"] == 0


# --- random faults ------------------------------------------------------------------------------------------------


def _fault_sequence(sim: ReportPlatformSimulator, count: int = 40) -> list[tuple[int, str | None]]:
    for _ in range(count):
        send(sim, "POST", "/v1/notifications", {"user_id": "alice", "message": "hi"})
    return [(c["status"], c["fault"]) for c in sim.calls()]


def test_seeded_random_faults_are_reproducible() -> None:
    config = {"fail_rate": 0.25, "throttle_rate": 0.25, "retry_after": 0, "slow_rate": 0.2, "slow_seconds": 0}
    with ReportPlatformSimulator(SimulatorConfig(seed=1234, **config)) as first:
        sequence = _fault_sequence(first)
        first.reset()
        assert _fault_sequence(first) == sequence
    with ReportPlatformSimulator(SimulatorConfig(seed=1234, **config)) as second:
        assert _fault_sequence(second) == sequence
    with ReportPlatformSimulator(SimulatorConfig(seed=4321, **config)) as other:
        assert _fault_sequence(other) != sequence
    assert {fault for _, fault in sequence} == {None, "503", "429", "slow"}
    assert {status for status, fault in sequence if fault == "slow"} == {202}


def test_random_throttle_sends_configured_retry_after() -> None:
    with ReportPlatformSimulator(SimulatorConfig(throttle_rate=1, retry_after=3, seed=1)) as simulator:
        reply = charge(simulator)
        assert (reply.status, reply.headers["Retry-After"]) == (429, "3")
        assert balance(simulator) == 100


# --- control, connections, concurrency ----------------------------------------------------------------------------


def test_control_client_over_http(sim: ReportPlatformSimulator) -> None:
    control = SimulatorControl(sim.url)
    control.wait_healthy(timeout=5)
    charge(sim, task_id="task-a")
    charge(sim, task_id="task-b")
    assert [c["task_id"] for c in control.calls()] == ["task-a", "task-b"]
    assert [c["task_id"] for c in control.calls(task_id="task-b")] == ["task-b"]
    assert control.state()["balances"] == {"alice": 80}

    config = control.set_faults(fail_rate=0.5, insufficient_users={"bob"}, rules=[{"status": 503}])
    assert config["fail_rate"] == 0.5
    assert config["insufficient_users"] == ["bob"]
    assert config["rules"] == [{"status": 503, "times": 1}]
    with pytest.raises(SimulatorError, match="fail_rate"):
        control.set_faults(fail_rate=2)

    after = control.reset()
    assert (after["fail_rate"], after["insufficient_users"], after["rules"]) == (0, [], [])
    assert control.calls() == []
    assert control.state()["charges"] == {}


def test_wait_healthy_times_out_when_nobody_listens() -> None:
    with ReportPlatformSimulator() as simulator:
        url = simulator.url
    with pytest.raises(TimeoutError):
        SimulatorControl(url).wait_healthy(timeout=0.3)


def test_keep_alive_connection_serves_several_calls(sim: ReportPlatformSimulator) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    try:
        headers = {"X-Task-Id": "t", "X-Request-Deadline": str(int(time.time() * 1000) + 30_000)}
        statuses = []
        for method, path, body in [
            ("PUT", "/v1/files/a", b'{"content": "x"}'),
            ("DELETE", "/v1/files/a", None),
            ("DELETE", "/v1/files/a", None),
            ("POST", "/v1/reports", b"{broken"),
            ("POST", "/v1/reports", b'{"user_id": "u", "topic": "t"}'),
        ]:
            connection.request(method, path, body=body, headers={**headers, "Idempotency-Key": f"ka-{next(_keys)}"})
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
        assert statuses == [201, 204, 404, 400, 200]
    finally:
        connection.close()


def test_concurrent_charges_never_overdraw(sim: ReportPlatformSimulator) -> None:
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        status = charge(sim, units=10).status
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one) for _ in range(15)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(statuses) == [201] * 10 + [402] * 5
    assert balance(sim) == 0


def test_stop_wakes_injected_delays_promptly() -> None:
    simulator = ReportPlatformSimulator(SimulatorConfig(slow_rate=1, slow_seconds=60)).start()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        charge(simulator, timeout=0.3)
    started = time.monotonic()
    simulator.stop()
    assert time.monotonic() - started < 3


def test_stop_wakes_long_work_promptly() -> None:
    simulator = ReportPlatformSimulator().start()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        send(simulator, "POST", "/v1/work", {"ms": 60_000}, timeout=0.3)
    started = time.monotonic()
    simulator.stop()
    assert time.monotonic() - started < 3


# --- management command argument validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port": None}, "--port is required"),
        ({"port": "http"}, "--port must be an integer"),
        ({"fail_rate": "1.5"}, "--fail-rate must be between 0 and 1"),
        ({"throttle_rate": "-0.1"}, "--throttle-rate must be between 0 and 1"),
        ({"slow_seconds": "-1"}, "--slow-seconds must be at least 0"),
        ({"retry_after": "soon"}, "--retry-after must be a number"),
        ({"initial_balance": "-5"}, "--initial-balance must be at least 0"),
    ],
)
def test_command_rejects_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    from django.core.management.base import CommandError

    from tasks.management.commands.run_report_platform import Command

    options = {
        "port": "0",
        "host": "127.0.0.1",
        "fail_rate": "0",
        "throttle_rate": "0",
        "retry_after": "1",
        "slow_rate": "0",
        "slow_seconds": "5",
        "insufficient_users": "",
        "initial_balance": "100",
        "seed": None,
        **overrides,
    }
    with pytest.raises(CommandError, match=message):
        Command().handle(**options)
