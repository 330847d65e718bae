"""The ``task_callback`` pipeline: one signed POST of a task's terminal event to its ``callback_url``.

Registered by the engine in every process (``TasksConfig.ready``), whatever
``RELIABILITY_PIPELINE_MODULES`` says, on the ``critical`` queue (a receiver
waiting for its callback does not wait behind a bulk backlog). Its one step:

- checks the URL's host against ``RELIABILITY_CALLBACK_ALLOWED_HOSTS`` again
  (the setting may have changed since the submission), and every address
  its name resolves to now (``tasks.outbound.policy``: never link-local, metadata,
  multicast or reserved);
- POSTs the body stored when the task finished through ``ctx.http``, signed
  for this attempt (``Reliability-Signature``,
  ``tasks.outbound.signing.body_signature_header``) with the client's secrets, with an
  ``Idempotency-Key`` that is one per task and event (the callback task's own
  effect key, recorded in its ledger);
- never follows a redirect (a 3xx is a permanent failure), so no receiver can
  point our servers at another address;
- 2xx: done; 408, 425, 429, 5xx, timeouts, refused connections: retried
  (``tasks.outbound.http_errors`` via ``raise_for_status``); any other status: failed.

Retries: ``RELIABILITY_CALLBACK_MAX_ATTEMPTS`` (8) attempts, backoff with
full jitter from ``RELIABILITY_CALLBACK_RETRY_BASE_SECONDS`` (5 s) tripled
per attempt up to an hour, within ``RELIABILITY_CALLBACK_DEADLINE_SECONDS``
(24 h). Then the callback task is FAILED and parked in the DLQ (nothing to
compensate), with the usual reasons; the original task is not touched.
"""

from __future__ import annotations

from tasks import registry
from tasks.conf import engine_settings
from tasks.delivery.queues import CRITICAL_QUEUE
from tasks.exceptions import InvalidTaskInput, PermanentError
from tasks.lifecycle.clients import signing_secrets
from tasks.models import ApiClient
from tasks.outbound.callback_events import CALLBACK_PIPELINE
from tasks.outbound.callback_urls import callback_url_check
from tasks.outbound.policy import resolved_addresses
from tasks.outbound.signing import SIGNATURE_HEADER, body_signature_header
from tasks.pipelines.pipeline import FailurePolicy, Pipeline
from tasks.pipelines.retry import RetryPolicy

# Each backoff ceiling is this many times the one before, up to MAX_BACKOFF_SECONDS.
BACKOFF_FACTOR = 3
MAX_BACKOFF_SECONDS = 3600
# A receiver should answer at once and do its work later; one that takes longer is retried.
SEND_TIMEOUT_SECONDS = 30
USER_AGENT = "reliability-console-callbacks/1"


def _build() -> Pipeline:
    pipeline = Pipeline(
        CALLBACK_PIPELINE,
        retry=RetryPolicy(
            max_attempts=engine_settings.CALLBACK_MAX_ATTEMPTS,
            base_delay=engine_settings.CALLBACK_RETRY_BASE_SECONDS,
            factor=BACKOFF_FACTOR,
            max_delay=MAX_BACKOFF_SECONDS,
        ),
        failure_policy=FailurePolicy.PARK,
        default_step_timeout=SEND_TIMEOUT_SECONDS,
        register=False,
        queue=CRITICAL_QUEUE,
    )

    @pipeline.step(effects=("callback",))
    def send_callback(ctx):
        url = ctx.input["url"]
        try:
            callback_url_check(url, resolve=resolved_addresses)
        except InvalidTaskInput as exc:
            raise PermanentError(str(exc), code="callback_url_refused") from None
        client = ApiClient.objects.filter(pk=ctx.input["client_id"]).first()
        if client is None or not client.is_active:
            raise PermanentError("the task's API client is gone or revoked", code="callback_client_revoked")
        secrets = signing_secrets(client)
        if not secrets:
            raise PermanentError("the task's API client has no signing secret", code="callback_unsigned")
        body = ctx.input["body"].encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            # Signed now, for this attempt: a receiver's tolerance window counts from here.
            SIGNATURE_HEADER: body_signature_header(secrets=secrets, body=body),
        }
        # ctx.http adds Idempotency-Key (this callback task's effect key: one per original task and
        # event), X-Task-Id (the callback task), X-Request-Deadline, and the time left as timeout.
        # stream=True: the status is all we need; a receiver cannot make us read a large answer.
        with ctx.http.post(
            url, data=body, headers=headers, effect="callback", allow_redirects=False, stream=True
        ) as response:
            if response.is_redirect or 300 <= response.status_code < 400:
                raise PermanentError(
                    f"the receiver answered {response.status_code}; callbacks do not follow redirects",
                    code="callback_redirect",
                )
            response.raise_for_status()
            return {"event": ctx.input["event"], "status": response.status_code}

    return pipeline


def register() -> Pipeline:
    """Register the pipeline once per process (idempotent)."""
    return registry.register_once(CALLBACK_PIPELINE, _build)
