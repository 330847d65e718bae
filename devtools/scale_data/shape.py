"""The shape of the scale data: its sizes and shares, pipelines, failure modes and outcomes, and a run's plan.

- six pipelines; task creation times spread evenly over the last 30 days, in
  insertion order (as a live table grows), the newest few in flight;
- ``min(tasks, dlq_items)`` tasks ever dead-lettered, spread over the table,
  failing in one of a handful of ways (ten fingerprints); about 30 % of the
  items unresolved (failed, compensating, compensated, being retried), the
  rest resolved with ``resolved_at`` set (retried and succeeded, compensated,
  closed); only a task's last item may be unresolved;
- every task state; the first DLQ tasks and the newest tasks take each
  outcome in turn, so even a small seed shows them all;
- a few hundred tasks get step attempts, checkpoints and side effects, so
  their pages have content.

Weights are relative within their table; ``devtools.scale_data.sql.sql_params``
turns the tables into the arrays the SQL indexes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

SEEDED_DAYS = 30
# Share of DLQ items left unresolved (the others are resolved, with resolved_at).
UNRESOLVED_SHARE = 0.3
# Share of the newest tasks that are still in flight (queued, running, retry scheduled) or cancelled.
IN_FLIGHT_SHARE = 0.0015
# Weighted choices are made by indexing an array of this many slots.
SLOTS = 1000
DETAILED_DLQ_TASKS = 200
DETAILED_OLDEST_TASKS = 100
DETAILED_NEWEST_TASKS = 50
SEEDED_TABLES = ("tasks_task", "dlq_dlqitem", "tasks_stepattempt", "tasks_checkpoint", "tasks_sideeffect")
TRANSIENT = "tasks.exceptions.TransientError"
PERMANENT = "tasks.exceptions.PermanentError"


@dataclass(frozen=True)
class PipelineShape:
    name: str
    steps: tuple[str, ...]
    weight: int
    input_key: str
    input_prefix: str


@dataclass(frozen=True)
class FailureMode:
    pipeline: str
    step: str
    error_code: str
    error_class: str
    reason_code: str
    message: str  # "{n}" becomes a number that varies per task
    attempts: int
    attempt_outcome: str
    weight: int


@dataclass(frozen=True)
class Outcome:
    task_state: str
    weight: int
    dlq_status: str = ""  # of the task's last DLQ item; "" for a task never dead-lettered
    resolution_code: str = ""


PIPELINES = (
    PipelineShape("report", ("charge_quota", "generate_report", "upload_file", "notify_user"), 35, "topic", "sales "),
    PipelineShape("invoice", ("load_order", "render_pdf", "store_pdf", "email_customer"), 20, "order_id", "ord-"),
    PipelineShape("email_digest", ("collect_events", "render_digest", "send_email"), 15, "digest", "weekly-"),
    PipelineShape(
        "image_thumbnails", ("download_image", "resize", "upload_thumbnails"), 12, "image_url", "https://cdn/img/"
    ),
    PipelineShape("data_export", ("query_warehouse", "write_csv", "upload_export", "notify_owner"), 10, "job", "exp-"),
    PipelineShape("webhook_delivery", ("sign_payload", "deliver"), 8, "endpoint", "https://hooks/"),
)
FAILURE_MODES = (
    FailureMode(
        "report", "charge_quota", "insufficient_quota", PERMANENT, "permanent_error",
        "POST /v1/quota/charges: HTTP 402: user-{n} has no quota left", 1, "permanent_error", 40,
    ),
    FailureMode(
        "report", "generate_report", "http_503", TRANSIENT, "attempts_exhausted",
        "POST /v1/reports: HTTP 503: model backend overloaded (request r-{n})", 5, "transient_error", 35,
    ),
    FailureMode(
        "report", "upload_file", "timeout", TRANSIENT, "deadline_exceeded",
        "PUT /v1/files/report-{n}.txt: no answer in time", 3, "timeout", 25,
    ),
    FailureMode(
        "invoice", "render_pdf", "unhandled_exception", "builtins.KeyError", "permanent_error",
        "'vat_number' missing in order ord-{n}", 1, "permanent_error", 60,
    ),
    FailureMode(
        "invoice", "email_customer", "rate_limited", TRANSIENT, "attempts_exhausted",
        "POST /v1/send: HTTP 429: too many requests (retry after {n} ms)", 5, "transient_error", 40,
    ),
    FailureMode(
        "email_digest", "send_email", "connection_error", TRANSIENT, "attempts_exhausted",
        "POST /v1/send: connection failed (relay-{n})", 5, "transient_error", 100,
    ),
    FailureMode(
        "image_thumbnails", "resize", "step_timeout", "tasks.exceptions.StepTimeout", "crash_loop",
        "resize of img-{n} killed its worker", 3, "crashed", 70,
    ),
    FailureMode(
        "image_thumbnails", "download_image", "http_404", PERMANENT, "permanent_error",
        "GET /img/{n}.png: HTTP 404: not found", 1, "permanent_error", 30,
    ),
    FailureMode(
        "data_export", "query_warehouse", "http_500", TRANSIENT, "attempts_exhausted",
        "POST /v1/query: HTTP 500: warehouse error (job {n})", 5, "transient_error", 100,
    ),
    FailureMode(
        "webhook_delivery", "deliver", "http_410", PERMANENT, "permanent_error",
        "POST https://hooks/{n}: HTTP 410: endpoint gone", 1, "permanent_error", 100,
    ),
)  # fmt: skip
COMPENSATION_ERROR_CODE = "http_500"
COMPENSATION_ERROR = "compensation failed: HTTP 500 from the platform (ref c-{n})"
RETRY_SCHEDULED_ERROR = ("http_503", TRANSIENT, "HTTP 503: service unavailable (request r-{n})")

# Tasks never dead-lettered: the newest are in flight, the rest succeeded.
SUCCEEDED = Outcome("succeeded", 1)
# Cancelled tasks are finished but never dead-lettered (their steps were compensated): counted here.
CANCELLED = Outcome("cancelled", 10)
IN_FLIGHT_OUTCOMES = (
    Outcome("queued", 40),
    Outcome("running", 20),
    Outcome("retry_scheduled", 20),
    CANCELLED,
    SUCCEEDED,
    Outcome("waiting", 10),  # submitted to start later (wait_for start): no attempt yet
)
CANCEL_MESSAGE = "cancelled by client:seed: no longer needed"
UNRESOLVED_OUTCOMES = (
    Outcome("failed", 60, "open"),
    Outcome("compensation_failed", 10, "open"),
    Outcome("queued", 8, "retrying"),
    Outcome("compensating", 7, "compensating"),
    Outcome("compensated", 15, "compensated"),
)
RESOLVED_OUTCOMES = (
    Outcome("succeeded", 45, "resolved", "retried"),
    Outcome("compensated", 20, "resolved", "compensated"),
    Outcome("failed", 10, "resolved", "fixed_manually"),
    Outcome("failed", 10, "resolved", "ignored"),
    Outcome("failed", 8, "resolved", "not_a_bug"),
    Outcome("failed", 7, "resolved", "duplicate"),
)
OUTCOMES = (*IN_FLIGHT_OUTCOMES, *UNRESOLVED_OUTCOMES, *RESOLVED_OUTCOMES)
RESOLUTION_NOTES = {
    "retried": "the task succeeded after a retry",
    "compensated": "compensated; nothing more to do",
    "fixed_manually": "fixed by hand in the platform",
    "ignored": "test account",
    "not_a_bug": "the user's input was wrong",
    "duplicate": "a duplicate of an earlier request",
    "": "",
}
FAILURE_STATES = ("failed", "compensating", "compensated", "compensation_failed")


@dataclass(frozen=True)
class SeedPlan:
    tasks: int
    dlq_items: int
    seed: int
    salt: str
    now: datetime

    @property
    def dlq_tasks(self) -> int:
        # One item per task while there are enough tasks; beyond that, earlier items of a task are resolved.
        return min(self.tasks, self.dlq_items)

    @property
    def in_flight(self) -> int:
        return max(len(IN_FLIGHT_OUTCOMES), round(self.tasks * IN_FLIGHT_SHARE))
