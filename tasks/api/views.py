"""The task submission API, ``/api/v1/``: thin views over the services and selectors."""

from __future__ import annotations

import logging
import re

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Header, NinjaAPI, Path, Query
from ninja.decorators import decorate_view
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer
from pydantic import ValidationError as PydanticValidationError

from tasks.api.errors import ApiError, engine_error_status, error_response, json_bytes
from tasks.api.parser import StrictJsonParser, chunked_bodies, payload_too_large, read_json_body
from tasks.api.schemas import (
    CancelIn,
    ErrorOut,
    IdempotencyRecordOut,
    SignalIn,
    SignalOut,
    TaskBatchIn,
    TaskBatchOut,
    TaskCreateIn,
    TaskOut,
    TaskPageOut,
    TaskStateName,
)
from tasks.api.services import api_task_cancel, api_task_submit, api_task_submit_many
from tasks.exceptions import (
    ReliabilityError,
)
from tasks.lifecycle.clients import api_client_authenticate
from tasks.lifecycle.signals import task_signal
from tasks.observability.tracing import traced_request
from tasks.pipelines.attributes import MAX_ATTRIBUTES, AttributeRefused, attribute_filter_checked
from tasks.selectors.tasks import (
    idempotency_record_for_client,
    task_for_client,
    task_page,
    task_representation,
    task_summary,
)

logger = logging.getLogger(__name__)

IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7E]{1,255}$"
IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    411: ErrorOut,
    413: ErrorOut,
    415: ErrorOut,
    422: ErrorOut,
}


class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``; the token itself is never logged."""

    def __call__(self, request: HttpRequest):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str):
        return api_client_authenticate(token=token)


api = NinjaAPI(
    title="Reliability Console API",
    version="1",
    description="Submit tasks and follow them to a terminal state. Errors are "
    '`{"error": {"code", "message", "details"}}`.',
    urls_namespace="api-v1",
    auth=BearerToken(),
    parser=StrictJsonParser(),
    docs_url="/docs",
    openapi_url="/openapi.json",
)
# Before authentication and django-ninja's own reading of the body, which would find a chunked one empty.
api.add_decorator(chunked_bodies, mode="view")


@api.post(
    "/tasks",
    response={201: TaskOut, **ERRORS},
    by_alias=True,  # a task's "waiting" has the field "for", a Python keyword: WaitingOut names it by alias
    summary="Submit a task",
    description="With an `Idempotency-Key`, a repeat of the same request answers the first response again "
    "(header `Idempotent-Replayed: true`); the same key with another body is a 422; a repeat while the first "
    "is still being processed waits briefly, then is a 409.",
)
@decorate_view(traced_request("/api/v1/tasks"))  # continues the caller's traceparent (tasks.observability.tracing)
def create_task(
    request: HttpRequest,
    payload: TaskCreateIn,
    idempotency_key: str | None = Header(
        None, alias="Idempotency-Key", min_length=1, max_length=255, pattern=IDEMPOTENCY_KEY_PATTERN
    ),
):
    result = api_task_submit(client=request.auth, body=payload.model_dump(), idempotency_key=idempotency_key)
    response = HttpResponse(result.body, status=result.status, content_type="application/json")
    if result.replayed:
        response["Idempotent-Replayed"] = "true"
    return response


@api.post(
    "/tasks/batch",
    response={200: TaskBatchOut, **ERRORS},
    by_alias=True,
    summary="Submit up to 1,000 tasks at once",
    description="Each item is a submission of its own, in one transaction: its validation, its `idempotency_key` "
    "(replayed as a single submission's `Idempotency-Key` would be, and shared with them), and its answer at its "
    "place in `items` (`status` is what a single submission would have answered). A bad item refuses only "
    'itself; with `"atomic": true` it refuses the batch (a 422 `batch_refused` naming the bad items) and '
    "nothing is stored. The request's own `Idempotency-Key` header is refused: each item has its key.",
)
@decorate_view(traced_request("/api/v1/tasks/batch"))
def create_task_batch(
    request: HttpRequest,
    payload: TaskBatchIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key"),
):
    if idempotency_key is not None:
        raise ApiError(
            400,
            "idempotency_key_per_item",
            "a batch has no Idempotency-Key of its own: give each item its idempotency_key",
        )
    body = payload.model_dump()
    body = api_task_submit_many(client=request.auth, items=body["items"], atomic=body["atomic"])
    return HttpResponse(body, status=200, content_type="application/json")


@api.get(
    "/tasks/{task_id}",
    response={200: TaskOut, **ERRORS},
    summary="One task with its steps",
    description="With `logs=true`, each step's `attempt_logs`: every attempt with what the step logged in it "
    "(without, they are null: the answer is then the body a completion callback sends).",
    by_alias=True,
)
def get_task(request: HttpRequest, task_id: str, logs: bool = Query(False)):
    task = task_for_client(client=request.auth, task_id=task_id)
    if task is None:
        raise ApiError(404, "not_found", "no such task")
    return _json(task_representation(task, logs=logs))


CANCEL_BODY = {"required": False, "content": {"application/json": {"schema": CancelIn.model_json_schema()}}}


@api.post(
    "/tasks/{task_id}/cancel",
    response={200: TaskOut, 202: TaskOut, **ERRORS},
    by_alias=True,
    summary="Cancel a task",
    description="A queued or retry-scheduled task is cancelled at once (its completed steps compensated); a "
    "running one stops at its next step boundary, or sooner if it is waiting. 202 while the cancel is under "
    "way, 200 once the task is cancelled; a repeat is the same cancel. A finished task is a 409 "
    '`task_not_cancellable` with its `state`. Body optional: `{"reason": "..."}`.',
    openapi_extra={"requestBody": CANCEL_BODY},
)
def cancel_task(request: HttpRequest, task_id: str):
    reason = ""
    if request.body:
        try:
            reason = CancelIn.model_validate(read_json_body(request)).reason or ""
        except PydanticValidationError as exc:
            details = {".".join(str(p) for p in e["loc"]) or "body": e["msg"] for e in exc.errors()}
            raise ApiError(400, "validation_error", "the request is not valid", details) from None
    task = task_for_client(client=request.auth, task_id=task_id)
    if task is None:
        raise ApiError(404, "not_found", "no such task")
    status, body = api_task_cancel(
        client=request.auth, task_id=task.pk, reason=reason, client_ip=request.META.get("REMOTE_ADDR")
    )
    return HttpResponse(body, status=status, content_type="application/json")


@api.post(
    "/tasks/{task_id}/signals/{name}",
    response={202: SignalOut, **ERRORS},
    summary="Send a signal to a task",
    description="Stored, and the task released if it was waiting for it (202). A signal sent before the task "
    "reaches its wait is kept and consumed there. The same signal again with the same payload answers the first "
    "again; with another payload it is a 409 `signal_already_received`; a name its pipeline does not wait for "
    "is a 422 `unknown_signal`; a finished task a 409 `task_finished`. An `Idempotency-Key` already used for "
    "another signal of the task is a 422 `idempotency_key_reused`.",
)
def send_signal(
    request: HttpRequest,
    task_id: str,
    payload: SignalIn,
    name: str = Path(..., max_length=100),
    idempotency_key: str | None = Header(
        None, alias="Idempotency-Key", min_length=1, max_length=255, pattern=IDEMPOTENCY_KEY_PATTERN
    ),
):
    task = task_for_client(client=request.auth, task_id=task_id)
    if task is None:
        raise ApiError(404, "not_found", "no such task")
    result = task_signal(
        task_id=task.pk,
        name=name,
        payload=payload.payload,
        client=request.auth,
        sent_by=f"client:{request.auth.name}",
        idempotency_key=idempotency_key or "",
    )
    signal = result.signal
    return HttpResponse(
        json_bytes({"task_id": str(task.pk), "name": signal.name, "received_at": signal.received_at}),
        status=202,
        content_type="application/json",
    )


@api.get(
    "/tasks",
    response={200: TaskPageOut, **ERRORS},
    summary="The client's tasks, newest first",
    description="`attribute.<name>=<value>` (repeatable for several names) keeps the tasks whose search "
    "attribute `<name>` is exactly `<value>`, e.g. `?attribute.order_id=A1001`; a bad one is a 400 "
    "`invalid_filter` naming it.",
    by_alias=True,
)
def list_tasks(
    request: HttpRequest,
    state: TaskStateName | None = Query(None),
    pipeline: str | None = Query(None, max_length=100),
    cursor: str | None = Query(None, max_length=200),
    limit: int = Query(20, ge=1, le=100),
):
    tasks, next_cursor = task_page(
        client=request.auth,
        state=state,
        pipeline=pipeline,
        cursor=cursor,
        limit=limit,
        attributes=_attribute_filters(request),
    )
    return _json({"items": [task_summary(task) for task in tasks], "next_cursor": next_cursor})


@api.get(
    "/idempotency-keys/{key}",
    response={200: IdempotencyRecordOut, **ERRORS},
    summary="What an idempotency key of this client maps to",
)
def get_idempotency_key(request: HttpRequest, key: str = Path(..., max_length=255)):
    record = None
    if IDEMPOTENCY_KEY.fullmatch(key):  # a key no request could have used has no record
        record = idempotency_record_for_client(client=request.auth, key=key)
    if record is None:
        raise ApiError(404, "not_found", "no record for this idempotency key (never used, or expired)")
    return _json(
        {
            "key": record.key,
            "task_id": str(record.task_id) if record.task_id else None,
            "request_fingerprint": record.fingerprint,
            "first_response_status": record.response_status,
            "state": record.state,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "replays": record.replay_count,
        }
    )


ATTRIBUTE_PARAMETER = "attribute."


def _attribute_filters(request: HttpRequest) -> list[tuple[str, str]]:
    """The ``attribute.<name>=<value>`` parameters of a list request, checked (``tasks.pipelines.attributes``)."""
    found = []
    for parameter in request.GET:
        if not parameter.startswith(ATTRIBUTE_PARAMETER):
            continue
        values = request.GET.getlist(parameter)
        if len(values) != 1:
            raise ApiError(
                400, "invalid_filter", f"{parameter} is given {len(values)} times", details={"parameter": parameter}
            )
        try:
            found.append(attribute_filter_checked(parameter[len(ATTRIBUTE_PARAMETER) :], values[0]))
        except AttributeRefused as exc:
            raise ApiError(400, "invalid_filter", str(exc), details={"parameter": parameter}) from None
    if len(found) > MAX_ATTRIBUTES:
        raise ApiError(400, "invalid_filter", f"at most {MAX_ATTRIBUTES} attribute filters", details=None)
    return found


def _json(value) -> HttpResponse:
    return HttpResponse(json_bytes(value), content_type="application/json")


# --- errors: one shape, stable codes, never a traceback --------------------------


@api.exception_handler(ApiError)
def on_api_error(request, exc: ApiError):
    return error_response(exc.status, exc.code, exc.message, exc.details)


@api.exception_handler(ReliabilityError)
def on_engine_error(request, exc: ReliabilityError):
    status, code = engine_error_status(exc)
    if status == 500:
        return on_unexpected(request, exc)
    response = error_response(status, code, exc.message, exc.details or None)
    if status == 409:
        response["Retry-After"] = "1"
    return response


@api.exception_handler(NinjaValidationError)
def on_validation_error(request, exc: NinjaValidationError):
    details = {}
    for error in exc.errors:
        location = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "payload"))
        details[location or "body"] = error.get("msg", "invalid")
    return error_response(400, "validation_error", "the request is not valid", details)


@api.exception_handler(AuthenticationError)
def on_authentication_error(request, exc):
    response = error_response(401, "unauthenticated", "send a valid token as Authorization: Bearer <token>")
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return error_response(404, "not_found", "not found")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    # django-ninja wraps our parser's errors in "Cannot parse request body".
    if isinstance(exc.__cause__, ApiError):
        return on_api_error(request, exc.__cause__)
    return error_response(exc.status_code, "http_error", str(exc))


def on_database_unavailable(request, exc):
    # The database restarting or failing over: nothing was stored (a submission's
    # key is released or goes stale), and the same request may be sent again.
    logger.warning("database unavailable", extra={"event": "api_database_unavailable", "path": request.path})
    response = error_response(503, "database_unavailable", "the database is unavailable; retry shortly")
    response["Retry-After"] = "1"
    return response


def on_body_too_large(request, exc):
    # django-ninja reads the body before our parser can check its declared size.
    return on_api_error(request, payload_too_large())


api.add_exception_handler(RequestDataTooBig, on_body_too_large)
api.add_exception_handler(OperationalError, on_database_unavailable)
api.add_exception_handler(InterfaceError, on_database_unavailable)


@api.exception_handler(Exception)
def on_unexpected(request, exc: Exception):
    logger.exception("API request failed", extra={"event": "api_error", "path": request.path})
    return error_response(500, "internal_error", "something went wrong on our side; it has been logged")


def not_found(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """JSON 404 for any path under /api/ that no route matches."""
    return error_response(404, "not_found", "no such API endpoint")
