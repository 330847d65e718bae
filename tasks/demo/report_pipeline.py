"""The demo "AI report" pipeline: charge quota, generate the report, upload it, notify the user.

On permanent failure it refunds the charge, deletes the file, then tells the
user once why the report failed.
"""

from __future__ import annotations

from typing import Any

from tasks import FailurePolicy, Pipeline
from tasks.demo.platform_client import ReportPlatform
from tasks.exceptions import InvalidTaskInput, PermanentError
from tasks.pipelines.retry import RetryPolicy

MAX_USER_ID_LENGTH = 100
MAX_TOPIC_LENGTH = 500


def validate_report_input(data: Any) -> dict:
    """Input: ``{"user_id": str, "topic": str}``, nothing else."""
    if not isinstance(data, dict):
        raise InvalidTaskInput("input must be an object", details={"input": "must be an object"})
    errors: dict[str, str] = {}
    for field, limit in (("user_id", MAX_USER_ID_LENGTH), ("topic", MAX_TOPIC_LENGTH)):
        value = data.get(field)
        if not isinstance(value, str) or not value.strip():
            errors[field] = "required, a non-empty string"
        elif len(value) > limit:
            errors[field] = f"at most {limit} characters"
        elif field == "user_id" and not all(ch.isalnum() or ch in "-_.@" for ch in value):
            errors[field] = "letters, digits and - _ . @ only"
    for extra in sorted(set(data) - {"user_id", "topic"}):
        errors[extra] = "unknown field"
    if errors:
        raise InvalidTaskInput("invalid report input", details=errors)
    return {"user_id": data["user_id"], "topic": data["topic"]}


report = Pipeline(
    "report",
    retry=RetryPolicy(max_attempts=5, base_delay=0.5, factor=2.0, max_delay=8.0),
    failure_policy=FailurePolicy.COMPENSATE,
    default_step_timeout=10.0,
    validate_input=validate_report_input,
    # The console finds a user's reports by user_id:alice, the API by ?attribute.user_id=alice.
    search_attributes=("user_id",),
)


def file_name(ctx) -> str:
    return f"report-{ctx.task_id}-g{ctx.generation}.txt"


@report.step(timeout=10.0, effects=("charge",))
def charge_quota(ctx) -> dict:
    platform = ReportPlatform(ctx)
    return platform.charge(user_id=ctx.input["user_id"], units=1)


@charge_quota.compensation
def refund_quota(ctx) -> None:
    platform = ReportPlatform(ctx)
    charge_id = (ctx.output or {}).get("charge_id")
    if charge_id is None:
        # The charge's outcome is unknown (it timed out). Replaying it with its
        # own key returns the original charge if there was one, without a new
        # effect; a 402 means there was none and nothing is owed back.
        try:
            charge_id = platform.charge(user_id=ctx.input["user_id"], units=1)["charge_id"]
        except PermanentError as exc:
            if exc.code == "insufficient_quota":
                return
            raise
    platform.refund(charge_id=charge_id)


@report.step(timeout=15.0, effects=("report",))
def generate_report(ctx) -> dict:
    platform = ReportPlatform(ctx)
    return platform.create_report(user_id=ctx.input["user_id"], topic=ctx.input["topic"])


@report.step(timeout=10.0, effects=("file",))
def upload_file(ctx) -> dict:
    platform = ReportPlatform(ctx)
    text = ctx.outputs["generate_report"]["text"]
    return platform.put_file(name=file_name(ctx), content=text)


@upload_file.compensation
def delete_file(ctx) -> None:
    ReportPlatform(ctx).delete_file(name=file_name(ctx))


@report.step(timeout=10.0, effects=("notification",))
def notify_user(ctx) -> dict:
    platform = ReportPlatform(ctx)
    url = ctx.outputs["upload_file"]["url"]
    message = f"Your report on {ctx.input['topic']!r} is ready: {url}"
    return platform.notify(user_id=ctx.input["user_id"], message=message)


@report.failure_notice
def notify_failure(ctx) -> None:
    failure = ctx.failure or {}
    message = (
        f"Your report on {ctx.input['topic']!r} could not be generated "
        f"({failure.get('reason', 'failed')}: {failure.get('code', '')}). Any quota charged was refunded."
    )
    ReportPlatform(ctx).notify(user_id=ctx.input["user_id"], message=message)
