"""Acme's order pipeline: charge the payment, then confirm the order; refund the charge if the order fails.

Both steps call Acme's API over ``ctx.http``, whose base URL is ``ACME_API_URL``.
Each call names its effect, so it carries an ``Idempotency-Key`` that stays the
same on every retry of the step (Acme answers a repeated key with its first
answer and acts once).
"""

from __future__ import annotations

import os
from typing import Any

from tasks import FailurePolicy, InvalidTaskInput, PermanentError, Pipeline, RetryPolicy

CURRENCIES = {"EUR", "GBP", "USD"}
MAX_AMOUNT_CENTS = 1_000_000


def validate_order(data: Any) -> dict:
    """Input: ``{"order_id": str, "amount_cents": int, "currency": "EUR" | "GBP" | "USD"}``, nothing else."""
    if not isinstance(data, dict):
        raise InvalidTaskInput("input must be an object", details={"input": "must be an object"})
    errors: dict[str, str] = {}
    order_id = data.get("order_id")
    if not isinstance(order_id, str) or not order_id.isascii() or not order_id.isalnum() or len(order_id) > 64:
        errors["order_id"] = "required: 1 to 64 letters or digits"
    amount = data.get("amount_cents")
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= MAX_AMOUNT_CENTS:
        errors["amount_cents"] = f"required: a whole number of cents from 1 to {MAX_AMOUNT_CENTS}"
    if data.get("currency") not in CURRENCIES:
        errors["currency"] = f"required: one of {', '.join(sorted(CURRENCIES))}"
    for extra in sorted(set(data) - {"order_id", "amount_cents", "currency"}):
        errors[extra] = "unknown field"
    if errors:
        raise InvalidTaskInput("invalid order", details=errors)
    return {"order_id": order_id, "amount_cents": amount, "currency": data["currency"]}


orders = Pipeline(
    "acme_orders",
    retry=RetryPolicy(max_attempts=5, base_delay=0.5, factor=2, max_delay=10),
    failure_policy=FailurePolicy.COMPENSATE,
    default_step_timeout=10,
    validate_input=validate_order,
)


def acme_api() -> str:
    """Acme's API, read when a step runs (not at import): a worker uses the environment it was started with."""
    url = os.environ.get("ACME_API_URL", "").rstrip("/")
    if not url:
        raise PermanentError("ACME_API_URL is not set", code="acme_api_url_missing")
    return url


def post_charge(ctx):
    """POST /payments under the "charge" key: the first call charges, a repeat returns the first answer."""
    payment = {key: ctx.input[key] for key in ("order_id", "amount_cents", "currency")}
    return ctx.http.post(f"{acme_api()}/payments", json=payment, effect="charge")


@orders.step(timeout=10, effects=("charge",))
def charge_payment(ctx) -> dict:
    response = post_charge(ctx)
    response.raise_for_status()  # 429 and 5xx are retried; any other 4xx (402: card declined) fails the task
    return {"payment_id": response.json()["payment_id"]}  # the checkpoint, ctx.outputs["charge_payment"] later


@charge_payment.compensation
def refund_payment(ctx) -> None:
    payment = ctx.output
    if payment is None:
        # The charge's answer was lost (a timeout, a 5xx). Repeating it under
        # its own key returns the charge if there was one, and charges no more.
        response = post_charge(ctx)
        if response.status_code == 402:
            return  # declined: nothing to refund
        response.raise_for_status()
        payment = response.json()
    response = ctx.http.post(f"{acme_api()}/payments/{payment['payment_id']}/refunds", json={}, effect="refund")
    response.raise_for_status()


@orders.step(timeout=10, effects=("confirm",))
def confirm_order(ctx) -> dict:
    order_id = ctx.input["order_id"]
    payment_id = ctx.outputs["charge_payment"]["payment_id"]
    response = ctx.http.post(
        f"{acme_api()}/orders/{order_id}/confirmation", json={"payment_id": payment_id}, effect="confirm"
    )
    response.raise_for_status()  # a 409 (the order was cancelled meanwhile) fails the task: the charge is refunded
    return {"order_id": order_id, "status": response.json()["status"]}
