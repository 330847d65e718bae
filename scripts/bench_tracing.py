"""What traces cost a worker (issue 24, point 1): a 10-step task run in-process with tracing off and on.

In one process, ``bench_noop_10`` tasks are submitted (not timed) and then each run to its end by
``tasks.execution.runner.task_run`` (timed: the claim, 10 steps and their writes, the finish), as a worker's job runs
them:

- ``off``: tracing off (``tasks.observability.tracing.active`` None), the hot path's one check of it per run and
  attempt;
- ``on``: tracing on, every span (a run, 10 attempts) batched to an OTLP/HTTP exporter that sends them to a
  receiver in another process on 127.0.0.1 (so the export's own threads and requests are counted here).

The modes alternate in ``--rounds`` rounds of ``--tasks`` tasks (neither always runs on a warmer or busier
machine); the medians per task and per step are printed. ``attempt_run`` of a no-op step (no database) is
timed the same way, for the per-attempt cost alone.

``--modes off`` imports nothing of the tracing modules, so the same script times a checkout from before them
(``PYTHONPATH=<that checkout>``): the before/after figure of tracing off. Needs ``DATABASE_URL`` naming a
migrated PostgreSQL database of its own and ``REDIS_URL`` (deliveries of the submitted tasks pile up there:
the script empties that Redis database at the end, so give it one of its own, e.g. ``redis://…/9``).
Run: ``DATABASE_URL=… REDIS_URL=… .venv/bin/python scripts/bench_tracing.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a checkout named there is the one timed


def _receive(port_pipe) -> None:
    """An OTLP/HTTP receiver that reads each export and answers 200 (what a collector's receiver does first)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_pipe.send(server.server_address[1])
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="10-step tasks per mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attempts", type=int, default=20_000, help="no-op attempt_run calls per mode")
    parser.add_argument("--modes", default="off,on", help="comma-separated: off, on")
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    os.environ["RELIABILITY_ENABLE_BENCH_PIPELINES"] = "1"
    os.environ["RELIABILITY_LOG_LEVEL"] = "WARNING"
    os.environ["RELIABILITY_TRACING"] = "0"  # switched below, per round
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("set DATABASE_URL to a migrated PostgreSQL database of this benchmark's own")
    import django

    django.setup()
    import tasks
    from tasks.execution.attempts import attempt_run
    from tasks.execution.context import StepContext
    from tasks.execution.runner import task_run
    from tasks.submission.submit import task_submit

    print(f"code timed: {Path(tasks.__file__).resolve().parent.parent}")
    tracers = {"off": None}
    receiver = provider = None
    if "on" in modes:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from tasks.observability import tracing
        from tasks.observability.otel import OtelTracing

        here, there = multiprocessing.Pipe()
        receiver = multiprocessing.Process(target=_receive, args=(there,), daemon=True)
        receiver.start()
        port = here.recv()
        provider = TracerProvider(resource=Resource.create({"service.name": "bench-tracing"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
        tracers["on"] = OtelTracing(provider)

    def use(mode: str) -> None:
        if "on" in modes:
            tracing.active = tracers[mode]

    def run_tasks(count: int) -> float:
        ids = [str(task_submit(pipeline="bench_noop_10", input={}).pk) for _ in range(count)]
        if provider is not None:
            provider.force_flush()
        started = time.perf_counter()
        for task_id in ids:
            if task_run(task_id=task_id, worker="bench") != "succeeded":
                raise SystemExit(f"task {task_id} did not succeed")
        return (time.perf_counter() - started) / count

    def noop_attempts(count: int) -> float:
        ctx = StepContext(
            task_id=uuid.uuid4(),
            pipeline="bench",
            step="noop",
            input={},
            outputs={},
            deadline=None,
            call_deadline=time.time() + 3600,
            attempt=1,
            generation=0,
        )
        started = time.perf_counter()
        for _ in range(count):
            attempt_run(lambda ctx: None, ctx, kind="step", step_index=0, worker="bench", timeout=3600)
        return (time.perf_counter() - started) / count

    for mode in modes:  # warm-up: connections, prepared statements, the exporter's session
        use(mode)
        run_tasks(20)
    per_task: dict[str, list[float]] = {mode: [] for mode in modes}
    per_attempt: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_number in range(args.rounds):
        order = modes if round_number % 2 == 0 else modes[::-1]
        for mode in order:
            use(mode)
            per_task[mode].append(run_tasks(args.tasks))
            per_attempt[mode].append(noop_attempts(args.attempts // args.rounds))
    if provider is not None:
        provider.shutdown()
        receiver.terminate()
    from django_rq import get_connection

    get_connection().flushdb()  # the deliveries of the tasks run here: this benchmark's own Redis database

    print(f"bench_noop_10 run in-process, median of {args.rounds} rounds of {args.tasks} tasks:")
    for mode in modes:
        task_seconds = statistics.median(per_task[mode])
        print(
            f"  tracing {mode:3}: {task_seconds * 1000:7.3f} ms per task, {task_seconds * 1e5:6.1f} µs per step;"
            f" a no-op attempt_run {statistics.median(per_attempt[mode]) * 1e6:5.2f} µs"
        )
    if len(modes) == 2:
        ratio = statistics.median(per_task["on"]) / statistics.median(per_task["off"])
        print(f"  on / off: {ratio:.3f} per task")


if __name__ == "__main__":
    main()
