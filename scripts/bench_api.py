"""`make bench` (API part): requests/s and p50 / p99 latency of task submission, through gunicorn, concurrent clients.

Against a dedicated migrated database (``rc_bench_api``, dropped at the end unless ``--keep``) and Redis
database 14, with ``RELIABILITY_ENABLE_BENCH_PIPELINES=1``: gunicorn serves the project (``DJANGO_DEBUG=0``,
the gthread worker: 2 processes, one per core of the reference machine, with 4 threads each so a request's
PostgreSQL and Redis round trips overlap with another's Python), and an API client is created with
``manage.py create_api_token``. Client processes (2 by default, each with 4 threads, each thread on its own
keep-alive connection: 8 requests in flight, one per server thread) ``POST /api/v1/tasks`` a ``bench_noop_1``
task, in three variants:

- ``no key``: no ``Idempotency-Key``;
- ``unique key``: a new ``Idempotency-Key`` on every request (each reserves, then completes, a record);
- ``replay``: the ``unique key`` requests again, same keys and bodies: each answers the stored first response
  (``Idempotent-Replayed: true``) and creates nothing.

Each variant first runs its warm-up requests (not counted), then all clients start together and the clock runs
until the last one finished. Only 2xx answers count (for ``replay``, only replayed ones; elsewhere, only new
tasks); anything else is an error, reported, and more than a few fail the part. No worker runs: the submitted
tasks stay queued, so the figures are the API's alone. Clients and server share the machine's cores.

It is a benchmark, not a test: nothing is asserted, but the part prints its floors beside the figures (with
idempotency keys, the ``unique key`` variant: at least FLOOR_REQUESTS_PER_SECOND and a p99 under FLOOR_P99_MS
on the reference machine, 2 cores). ``run(...)`` does the work and returns the results;
``PART.main()`` is the command line.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import queue
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench_db import database_url, drop_database, scalar
from bench_part import REDIS_URL_OPTION, Option, Part, non_negative_int, positive_int, write_results
from bench_processes import (
    BENCH_DIR,
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    BenchError,
    create_migrated_database,
    log_directory,
    manage,
    project_env,
    redis_connection,
    start_web_server,
)

from chaos.processes import free_port, gunicorn_argv  # bench_processes put the repository root on sys.path

DEFAULT_OUTPUT = BENCH_DIR / "api.json"
PIPELINE = "bench_noop_1"
PATH = "/api/v1/tasks"
VARIANTS = ("no_key", "unique_key", "replay")
VARIANT_LABELS = {"no_key": "no key", "unique_key": "unique key", "replay": "replay"}
REQUEST_TIMEOUT_SECONDS = 60
# A client that has not reported this long after the start is stuck, however many requests it had.
CLIENT_TIMEOUT_SECONDS = 1800
# "More than a few" errors fail the part: this many, or this share of the timed requests if larger.
ALLOWED_ERRORS = 5
ALLOWED_ERROR_SHARE = 0.001
ERROR_SAMPLES = 3
# The floors for submissions with idempotency keys (the unique key variant), on 2 cores.
FLOOR_REQUESTS_PER_SECOND = 300
FLOOR_P99_MS = 50


OPTIONS = (
    Option("requests", type=positive_int, default=5000, help="timed requests per variant"),
    Option("warmup", type=non_negative_int, default=500, help="warm-up requests per variant"),
    Option("clients", type=positive_int, default=2, help="client processes"),
    Option("threads", type=positive_int, default=4, help="threads per client process"),
    Option("server_workers", type=positive_int, default=2, help="gunicorn worker processes"),
    Option("server_threads", type=positive_int, default=4, help="gunicorn threads per worker"),
    Option("variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="variants to time"),
    Option("database", default="rc_bench_api", help="the API part's database"),
    REDIS_URL_OPTION,
)


def _request_body(client: int, thread: int, index: int, phase: str) -> bytes:
    # Deterministic per request: a replay must send the very body its key was first used with.
    return json.dumps({"pipeline": PIPELINE, "input": {"phase": phase, "c": client, "t": thread, "n": index}}).encode()


def _thread_requests(count: int, client: int, thread: int, clients: int, threads: int) -> range:
    """This thread's share of ``count`` requests (the same for every variant, so replays find their keys)."""
    slots = clients * threads
    slot = client * threads + thread
    return range(count // slots + (1 if slot < count % slots else 0))


def _send(state: dict, variant: str, run_id: str, client: int, thread: int, indexes: range, phase: str) -> dict:
    """POST each request of ``indexes`` on one keep-alive connection; latencies (ms) of the good answers."""
    latencies, errors, samples = [], Counter(), []
    for index in indexes:
        headers = {"Authorization": f"Bearer {state['token']}", "Content-Type": "application/json"}
        if variant != "no_key":
            headers["Idempotency-Key"] = f"bench-{run_id}-{phase}-{client}-{thread}-{index}"
        body = _request_body(client, thread, index, phase)
        started = time.perf_counter()
        try:
            state["connection"].request("POST", PATH, body=body, headers=headers)
            response = state["connection"].getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as exc:
            label, answer = type(exc).__name__, str(exc).encode()
            state["connection"].close()  # the next request connects again
        else:
            elapsed_ms = (time.perf_counter() - started) * 1000
            replayed = response.getheader("Idempotent-Replayed") == "true"
            label = str(response.status)
            if 200 <= response.status < 300:
                if replayed == (variant == "replay"):
                    latencies.append(elapsed_ms)
                    continue
                label += " replayed" if replayed else " not replayed"
        errors[label] += 1
        if len(samples) < ERROR_SAMPLES:
            samples.append(f"{label}: {answer[:200]!r}")
    return {"latencies": latencies, "errors": errors, "samples": samples}


def _client(address, token, variant, run_id, client, clients, threads, warmup, requests, *, go, messages) -> None:
    """One client process: its threads warm up, it reports ready, and on ``go`` they send the timed requests."""
    warmed = threading.Barrier(threads + 1)
    start = threading.Event()
    outcomes: list[dict | None] = [None] * threads

    def thread_main(thread: int) -> None:
        state = {"token": token, "connection": http.client.HTTPConnection(*address, timeout=REQUEST_TIMEOUT_SECONDS)}
        try:
            warm = _thread_requests(warmup, client, thread, clients, threads)
            warm_errors = _send(state, variant, run_id, client, thread, warm, "warm")["errors"]
            # gunicorn closes a connection idle for 2 s (its keep-alive): the timed requests start on a new one.
            state["connection"].close()
            warmed.wait()
            start.wait()
            began = time.perf_counter()
            timed = _thread_requests(requests, client, thread, clients, threads)
            outcome = _send(state, variant, run_id, client, thread, timed, "timed")
            outcomes[thread] = {**outcome, "began": began, "ended": time.perf_counter(), "warm_errors": warm_errors}
        except BaseException:
            warmed.abort()  # the process reports the failure rather than wait for this thread forever
            raise
        finally:
            state["connection"].close()

    # Daemons: a process whose client failed exits without waiting for its other threads.
    workers = [threading.Thread(target=thread_main, args=(thread,), daemon=True) for thread in range(threads)]
    for worker in workers:
        worker.start()
    try:
        warmed.wait()
    except threading.BrokenBarrierError:
        messages.put(("failed", client))
        return
    messages.put(("ready", client))
    go.wait()
    start.set()
    for worker in workers:
        worker.join()
    messages.put(("failed", client) if None in outcomes else ("done", outcomes))


def _collect(messages, count: int, processes: list, variant: str) -> list:
    """``count`` messages from the clients; a failed, dead or silent client is a BenchError."""
    collected = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_SECONDS
    while len(collected) < count:
        try:
            kind, value = messages.get(timeout=1)
        except queue.Empty:
            if any(process.exitcode not in (None, 0) for process in processes):
                raise BenchError(f"an API client process died ({variant})") from None
            if time.monotonic() > deadline:
                raise BenchError(f"the API clients did not finish within {CLIENT_TIMEOUT_SECONDS}s ({variant})")
            continue
        if kind == "failed":
            raise BenchError(f"API client {value} failed ({variant}); its traceback is above")
        collected.append(value)
    return collected


def bench_variant(
    port: int, token: str, variant: str, run_id: str, clients: int, threads: int, warmup: int, requests: int
) -> dict:
    """Requests/s and latency of one variant, ``clients`` processes x ``threads`` threads."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    messages = context.Queue()
    processes = [
        context.Process(
            target=_client,
            args=(("127.0.0.1", port), token, variant, run_id, client, clients, threads, warmup, requests),
            kwargs={"go": go, "messages": messages},
        )
        for client in range(clients)
    ]
    for process in processes:
        process.start()
    try:
        _collect(messages, clients, processes, variant)  # every client warmed up
        go.set()
        outcomes = [outcome for done in _collect(messages, clients, processes, variant) for outcome in done]
    except BaseException:
        for process in processes:
            process.kill()
        raise
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    latencies = [latency for outcome in outcomes for latency in outcome["latencies"]]
    errors, warm_errors, samples = Counter(), Counter(), []
    for outcome in outcomes:
        errors.update(outcome["errors"])
        warm_errors.update(outcome["warm_errors"])
        samples.extend(outcome["samples"])
    seconds = max(outcome["ended"] for outcome in outcomes) - min(outcome["began"] for outcome in outcomes)
    cut_points = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    return {
        "variant": variant,
        "requests": requests,
        "ok": len(latencies),
        "seconds": round(seconds, 2),
        "requests_per_second": round(len(latencies) / seconds, 1),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(cut_points[98], 1) if latencies else None,
        "errors": dict(errors),
        "warmup_errors": dict(warm_errors),
        "error_samples": samples[:ERROR_SAMPLES],
    }


def run(
    *,
    requests: int = 5000,
    warmup: int = 500,
    clients: int = 2,
    threads: int = 4,
    server_workers: int = 2,
    server_threads: int = 4,
    variants: tuple[str, ...] = VARIANTS,
    database: str = "rc_bench_api",
    keep: bool = False,
    server_url: str = DEFAULT_SERVER_URL,
    redis_url: str = DEFAULT_REDIS_URL,
    output: Path | None = DEFAULT_OUTPUT,
    progress: Callable[[str], None] = print,
) -> dict:
    """Time each variant of ``POST /api/v1/tasks``; write ``output``; return ``{"variants", "figures", ...}``."""
    for name, value in (("requests", requests), ("clients", clients), ("threads", threads)):
        if value < 1:
            raise BenchError(f"{name} must be a positive integer")
    if warmup < 0 or server_workers < 1 or server_threads < 1:
        raise BenchError("warm-up requests must be >= 0, server workers and threads >= 1")
    if "replay" in variants and "unique_key" not in variants:
        raise BenchError("the replay variant replays the unique_key variant's keys: run both")
    variants = tuple(variant for variant in VARIANTS if variant in variants)
    log_dir = log_directory(output)
    url = database_url(server_url, database)
    env = project_env(url, redis_url)
    redis = redis_connection(redis_url)
    started = time.monotonic()
    measured = []
    server = None
    try:
        progress(f"bench: creating database {database!r}")
        create_migrated_database(server_url, database, env)
        redis.flushdb()
        token = manage(env, "create_api_token", "bench-client").strip().splitlines()[-1]
        port = free_port()
        argv = gunicorn_argv(port, processes=server_workers, threads=server_threads)
        server = start_web_server(argv, port, env, log_dir / "api-gunicorn.log", "/api/v1/openapi.json")
        progress(
            f"bench: gunicorn ({server_workers} workers x {server_threads} threads) on port {port}, "
            f"pid {server.processes[0].pid}"
        )
        run_id = uuid.uuid4().hex[:12]
        for variant in variants:
            before = scalar(url, "SELECT count(*) FROM tasks_task")
            result = bench_variant(port, token, variant, run_id, clients, threads, warmup, requests)
            server.check_alive()
            result["tasks_created"] = scalar(url, "SELECT count(*) FROM tasks_task") - before
            measured.append(result)
            progress(
                f"bench: API {VARIANT_LABELS[variant]}: {result['requests_per_second']:,.1f} req/s, "
                f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, errors {sum(result['errors'].values())}"
            )
            failed = sum(result["errors"].values()) + sum(result["warmup_errors"].values())
            if failed > max(ALLOWED_ERRORS, requests * ALLOWED_ERROR_SHARE):
                raise BenchError(
                    f"{VARIANT_LABELS[variant]}: {failed} requests failed ({result['errors']}, warm-up "
                    f"{result['warmup_errors']}), e.g. {result['error_samples']}; see {log_dir / 'api-gunicorn.log'}"
                )
    finally:
        if server is not None:
            server.stop()
        redis.flushdb()
        redis.close()
        if not keep:
            drop_database(server_url, database)

    figures = {}
    for result in measured:
        name = f"api.{result['variant']}"
        figures[f"{name}.requests_per_second"] = {"value": result["requests_per_second"], "unit": "req/s"}
        figures[f"{name}.p50"] = {"value": result["p50_ms"], "unit": "ms"}
        figures[f"{name}.p99"] = {"value": result["p99_ms"], "unit": "ms"}
        figures[f"{name}.errors"] = {"value": sum(result["errors"].values()), "unit": "requests"}
    results = {
        "variants": measured,
        "figures": figures,
        "floors": _floors(measured),
        "requests": requests,
        "warmup": warmup,
        "clients": clients,
        "threads": threads,
        "server_workers": server_workers,
        "server_threads": server_threads,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_results(output, results)
    return results


def _floors(measured: list[dict]) -> list[dict]:
    """The API's floors, read on the variant with idempotency keys (when it was timed)."""
    keyed = next((result for result in measured if result["variant"] == "unique_key"), None)
    if keyed is None:
        return []
    rate, p99 = keyed["requests_per_second"], keyed["p99_ms"]
    return [
        {
            "name": f"API with idempotency keys: >= {FLOOR_REQUESTS_PER_SECOND} req/s",
            "value": rate,
            "floor": FLOOR_REQUESTS_PER_SECOND,
            "holds": rate >= FLOOR_REQUESTS_PER_SECOND,
        },
        {
            "name": f"API with idempotency keys: p99 < {FLOOR_P99_MS} ms",
            "value": p99,
            "floor": FLOOR_P99_MS,
            "holds": p99 < FLOOR_P99_MS,
        },
    ]


def format_table(results: dict) -> str:
    header = f"{'variant':<12} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'tasks created':>14}"
    lines = [
        f"Submission API, POST {PATH} ({PIPELINE}) through gunicorn ({results['server_workers']} workers x "
        f"{results['server_threads']} threads): {results['requests']:,} timed requests per variant after "
        f"{results['warmup']:,} warm-up, {results['clients']} client processes x {results['threads']} threads "
        f"on keep-alive connections ({results['seconds']:.0f} s):",
        header,
        "-" * len(header),
    ]
    for result in results["variants"]:
        lines.append(
            f"{VARIANT_LABELS[result['variant']]:<12} {result['requests_per_second']:>8,.1f} "
            f"{result['p50_ms']:>8.1f} {result['p99_ms']:>8.1f} {sum(result['errors'].values()):>7} "
            f"{result['tasks_created']:>14,}"
        )
    lines.append("no worker runs: the tasks stay queued; replay repeats the unique-key requests (keys and bodies)")
    for floor in results["floors"]:
        verdict = "holds" if floor["holds"] else "DOES NOT HOLD"
        lines.append(f"floor: {floor['name']}: {floor['value']:,.1f} ({verdict})")
    return "\n".join(lines)


PART = Part(name="API", run=run, format_table=format_table, options=OPTIONS, default_output=DEFAULT_OUTPUT, doc=__doc__)

if __name__ == "__main__":
    sys.exit(PART.main())
