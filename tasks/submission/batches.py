"""Batch submission: up to 1,000 tasks in one transaction (``task_submit_many``, ``POST /api/v1/tasks/batch``).

Each item is a submission of its own, as ``tasks.submission.submit`` makes one:
its fingerprint, its validation, its idempotency key. A key's record is
the same as a single submission's, so an item repeated later (in another
batch or alone, with the same key) replays the item's first task, and the
other way round; a key named twice in one batch makes the second a repeat
of the first. A bad item refuses only itself (its outcome carries the
error) unless the batch is ``atomic``: then one bad item refuses the batch
(``BatchRefused``) and nothing is stored. The tasks of a batch are
delivered several per RQ job (``RELIABILITY_BATCH_DELIVERY_SIZE``,
``tasks.lifecycle.creation.tasks_create_many``), each claimed on its own.

Unlike a single submission, a batch does not wait for a twin still in
flight with one of its keys: that item is refused with
``idempotency_key_in_use`` (retry it), so one slow request cannot hold up a
thousand items.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from tasks.conf import engine_settings
from tasks.exceptions import (
    BatchRefused,
    IdempotencyKeyReused,
    InvalidTaskInput,
    ReliabilityError,
)
from tasks.lifecycle.creation import NewTask, tasks_create_many
from tasks.models import ApiClient, IdempotencyRecord, IdempotencyState, Task
from tasks.submission.idempotency import (
    idempotency_complete_many,
    idempotency_replayed,
    idempotency_reserve_many,
    key_in_use,
    key_reused,
)
from tasks.submission.submit import (
    PYTHON_SCOPE,
    check_idempotency_key,
    request_fingerprint,
    resolve_deadline,
    resolve_start,
    submission_checked,
)

MAX_BATCH_ITEMS = 1000
ITEM_FIELDS = frozenset({"pipeline", "input", "idempotency_key", "deadline", "callback_url", "run_at"})

# What a batch answers and stores for each new task's key: (HTTP status, body), or nothing (Python callers).
Responder = Callable[[Task], tuple[int, bytes]]


@dataclass(frozen=True)
class BatchItem:
    """One task of a batch, as ``task_submit`` takes it."""

    pipeline: str
    input: Any
    idempotency_key: str | None = None
    deadline: datetime | timedelta | float | None = None
    callback_url: str | None = None
    run_at: datetime | timedelta | float | None = None


@dataclass(frozen=True)
class BatchOutcome:
    """One item's outcome, at its place in the batch: a new task, a replay of an earlier one, or its error."""

    index: int
    task_id: uuid.UUID | None = None
    replayed: bool = False
    error: ReliabilityError | None = None
    # The answer stored with the item's key (HTTP): a replay's, or the new task's.
    response_status: int | None = None
    response_body: bytes | None = None
    # The task this item created (None for a replay or an error).
    created: Task | None = None

    def error_details(self) -> dict[str, Any] | None:
        if self.error is None:
            return None
        return {"index": self.index, "code": self.error.code, "message": self.error.message}


@dataclass
class _Plan:
    index: int
    item: BatchItem
    deadline_at: datetime | None
    fingerprint: str
    start_at: datetime | None = None
    spec: Any = None
    cleaned: Any = None
    repeats: list[_Plan] = field(default_factory=list)


def task_submit_many(
    items: Sequence[BatchItem | Mapping[str, Any]],
    *,
    atomic: bool = False,
    client: ApiClient | None = None,
    scope: str = PYTHON_SCOPE,
) -> list[BatchOutcome]:
    """Create the tasks of ``items`` (``BatchItem`` or dicts of its fields) in one transaction; their outcomes.

    Every outcome is in the order of ``items``. With ``atomic``, a bad item raises ``BatchRefused`` and
    nothing is stored; otherwise it refuses only itself.
    """
    return submission_create_many(items, atomic=atomic, client=client, scope=scope)


def submission_create_many(
    items: Sequence[BatchItem | Mapping[str, Any]],
    *,
    scope: str,
    client: ApiClient | None,
    atomic: bool,
    respond: Responder | None = None,
) -> list[BatchOutcome]:
    """The batch flow behind ``task_submit_many`` and the HTTP batch (``respond`` renders each item's answer)."""
    if not isinstance(items, Sequence) or isinstance(items, str | bytes) or not 1 <= len(items) <= MAX_BATCH_ITEMS:
        raise InvalidTaskInput(f"a batch holds 1 to {MAX_BATCH_ITEMS} items")
    outcomes: dict[int, BatchOutcome] = {}
    plans = []
    for index, raw in enumerate(items):
        try:
            plans.append(_planned(index, raw))
        except ReliabilityError as exc:
            outcomes[index] = BatchOutcome(index, error=exc)
    owners = _by_key(plans, outcomes)
    now = timezone.now()
    records = IdempotencyRecord.objects.filter(scope=scope, key__in=list(owners))
    replays: list[IdempotencyRecord] = []
    to_create = [plan for plan in plans if plan.item.idempotency_key is None]
    taken_over: dict[str, IdempotencyRecord] = {}
    known = {record.key: record for record in records}
    for key, plan in owners.items():
        record = known.get(key)
        stale = record is not None and (
            record.expires_at <= now
            or (
                record.state == IdempotencyState.IN_PROGRESS
                and record.fingerprint == plan.fingerprint
                and record.locked_at <= now - timedelta(seconds=engine_settings.IDEMPOTENCY_LOCK_SECONDS)
            )
        )
        if record is None or stale:
            if stale:
                taken_over[key] = record
            to_create.append(plan)
        elif record.fingerprint != plan.fingerprint:
            outcomes[plan.index] = BatchOutcome(plan.index, error=key_reused(record))
        elif record.state == IdempotencyState.COMPLETED:
            replays.append(record)
            outcomes[plan.index] = _replay(plan.index, record)
        else:
            outcomes[plan.index] = BatchOutcome(plan.index, error=key_in_use())
    to_create.sort(key=lambda plan: plan.index)
    for plan in list(to_create):
        try:
            _validate(plan, client)
        except ReliabilityError as exc:
            outcomes[plan.index] = BatchOutcome(plan.index, error=exc)
            to_create.remove(plan)
    if atomic:
        _refuse_if_any(plans, outcomes)
    with transaction.atomic():
        reserved = idempotency_reserve_many(
            scope=scope,
            entries=[(plan.item.idempotency_key, plan.fingerprint) for plan in to_create if plan.item.idempotency_key],
            taken_over=list(taken_over.values()),
        )
        for plan in list(to_create):
            key = plan.item.idempotency_key
            if key is not None and key not in reserved:
                # A concurrent request took the key between the read and this transaction.
                outcomes[plan.index] = BatchOutcome(plan.index, error=key_in_use())
                to_create.remove(plan)
        if atomic:
            _refuse_if_any(plans, outcomes)  # raised inside the block: the reservations roll back
        created = tasks_create_many(
            new=[
                NewTask(
                    spec=plan.spec,
                    input=plan.cleaned,
                    deadline=plan.deadline_at,
                    client=client,
                    scope=scope,
                    key=plan.item.idempotency_key,
                    fingerprint=plan.fingerprint,
                    callback_url=plan.item.callback_url or "",
                    start_at=plan.start_at,
                )
                for plan in to_create
            ]
        )
        completions = []
        for plan, task in zip(to_create, created, strict=True):
            status, body = respond(task) if respond is not None else (None, None)
            outcomes[plan.index] = BatchOutcome(
                plan.index, task_id=task.pk, response_status=status, response_body=body, created=task
            )
            if plan.item.idempotency_key is not None:
                completions.append((reserved[plan.item.idempotency_key], task, status, body))
        idempotency_complete_many(completions)
        idempotency_replayed(replays)
    for plan in plans:
        first = outcomes[plan.index]
        for repeat in plan.repeats:
            outcomes[repeat.index] = _repeat_of(repeat, first)
    return [outcomes[index] for index in range(len(items))]


def _planned(index: int, raw: BatchItem | Mapping[str, Any]) -> _Plan:
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - ITEM_FIELDS)
        if unknown or "pipeline" not in raw or "input" not in raw:
            raise InvalidTaskInput(
                "an item has a pipeline and an input, and may have idempotency_key, deadline, callback_url, run_at",
                details={"unknown": unknown} if unknown else None,
            )
        raw = BatchItem(**raw)
    if not isinstance(raw, BatchItem) or not isinstance(raw.pipeline, str):
        raise InvalidTaskInput("an item is a BatchItem or a dict of its fields")
    deadline_at, deadline_seconds = resolve_deadline(raw.deadline)
    start_at, start = resolve_start(raw.run_at, deadline_at)
    if raw.idempotency_key is not None:
        check_idempotency_key(raw.idempotency_key)
    fingerprint = request_fingerprint(
        pipeline=raw.pipeline,
        input=raw.input,
        deadline_seconds=deadline_seconds,
        callback_url=raw.callback_url,
        start=start,
    )
    return _Plan(index, raw, deadline_at, fingerprint, start_at)


def _by_key(plans: list[_Plan], outcomes: dict[int, BatchOutcome]) -> dict[str, _Plan]:
    """The first item of each key in the batch; a later one with the key becomes a repeat of it (or, with
    another request, is refused as a reused key)."""
    owners: dict[str, _Plan] = {}
    for plan in list(plans):
        key = plan.item.idempotency_key
        if key is None:
            continue
        first = owners.setdefault(key, plan)
        if first is plan:
            continue
        plans.remove(plan)
        if plan.fingerprint != first.fingerprint:
            outcomes[plan.index] = BatchOutcome(
                plan.index,
                error=IdempotencyKeyReused(
                    "this idempotency key is used by an earlier item of the batch with a different request",
                    details={"index": first.index},
                ),
            )
        else:
            first.repeats.append(plan)
    return owners


def _validate(plan: _Plan, client: ApiClient | None) -> None:
    plan.spec, plan.cleaned = submission_checked(
        pipeline=plan.item.pipeline, input=plan.item.input, callback_url=plan.item.callback_url, client=client
    )


def _refuse_if_any(plans: list[_Plan], outcomes: dict[int, BatchOutcome]) -> None:
    bad = sorted((outcome for outcome in outcomes.values() if outcome.error is not None), key=lambda o: o.index)
    repeats_of_bad = [
        BatchOutcome(repeat.index, error=outcomes[plan.index].error)
        for plan in plans
        if plan.index in outcomes and outcomes[plan.index].error is not None
        for repeat in plan.repeats
    ]
    if bad or repeats_of_bad:
        every = sorted([*bad, *repeats_of_bad], key=lambda outcome: outcome.index)
        raise BatchRefused(f"{len(every)} item(s) of the atomic batch were refused: nothing was stored", every)


def _replay(index: int, record: IdempotencyRecord) -> BatchOutcome:
    body = bytes(record.response_body) if record.response_body is not None else None
    return BatchOutcome(
        index, task_id=record.task_id, replayed=True, response_status=record.response_status, response_body=body
    )


def _repeat_of(repeat: _Plan, first: BatchOutcome) -> BatchOutcome:
    """A later item with the first item's key and request: what a repeat of the first would be answered."""
    if first.error is not None:
        return BatchOutcome(repeat.index, error=first.error)
    return BatchOutcome(
        repeat.index,
        task_id=first.task_id,
        replayed=True,
        response_status=first.response_status,
        response_body=first.response_body,
    )
