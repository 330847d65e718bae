"""API clients, their bearer tokens and their callback signing secrets.

Only a SHA-256 of each token is stored. A signing secret is stored as is (an
HMAC needs the key): it is shown by ``manage.py callback_secret`` and never
logged, nor shown whole in the admin.

Creating a client, revoking it and rotating its signing secret each let in or
stop all of a client's traffic and callbacks, so each is recorded, whoever
asked (the console, a management command, Python): ``api_client_changed`` is
sent inside the transaction of the change, ``api_client_refused`` when one is
refused (nothing changed). The engine knows nothing of the console's audit
log; the console's receivers (``dlq.client_audit``) write its entries.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import secrets
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from tasks.conf import engine_settings
from tasks.exceptions import ReliabilityError
from tasks.models import ApiClient

TOKEN_PREFIX = "rc_"
# Marks a callback signing secret for what it is (in a leaked text, a secret scanner's rule).
SIGNING_SECRET_PREFIX = "whsec_"
MAX_TOKEN_LENGTH = 200
MAX_NAME_LENGTH = 100
# Who may create and revoke clients and rotate their secrets (tasks.ApiClient's own permission; no role below
# superuser holds it: dlq.roles).
MANAGE_PERMISSION = "tasks.manage_apiclient"

# The changes the signals name.
CREATED = "created"
REVOKED = "revoked"
SECRET_ROTATED = "secret_rotated"
# Who changed a client when the caller names no one: Python code of the deployment.
PYTHON_ACTOR = "system:python"

# Sent inside the change's transaction: sender=ApiClient, client=, action= (CREATED, REVOKED, SECRET_ROTATED),
# actor=, client_ip=.
api_client_changed = Signal()
# Sent when a change is refused, outside any transaction of its own (there is nothing to commit with):
# sender=ApiClient, name= (as asked), action=, actor=, error= (an ApiClientError), client_ip=.
api_client_refused = Signal()


class ApiClientError(ReliabilityError):
    """A change to an API client refused; ``code`` says why, ``details`` holds the client's name."""

    code = "api_client_error"


def token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a plain hash cannot be brute-forced.
    return hashlib.sha256(token.encode()).hexdigest()


def command_actor() -> str:
    """The actor of a management command: ``command:<OS user>`` (the uid when the user has no name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no $USER
        user = str(os.getuid())
    return f"command:{user}"


def api_client_create(*, name: str, actor: str = PYTHON_ACTOR, client_ip: str | None = None) -> tuple[ApiClient, str]:
    """Create a client for ``actor``; return it and its token (shown once, never stored).

    Raises ``ApiClientError`` (audited as a refusal) for a name that is empty, too long or taken.
    """
    name = name.strip()
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise _refused(
            ApiClientError(
                f"a client name is 1 to {MAX_NAME_LENGTH} characters",
                code="client_name_invalid",
                details={"max": MAX_NAME_LENGTH},
            ),
            name=name,
            action=CREATED,
            actor=actor,
            client_ip=client_ip,
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            client = ApiClient.objects.create(name=name, token_hash=token_hash(token), token_prefix=token[:10])
            _changed(client, CREATED, actor, client_ip)
    except IntegrityError:
        error = ApiClientError(f"a client named {name!r} already exists", code="client_exists")
        raise _refused(error, name=name, action=CREATED, actor=actor, client_ip=client_ip) from None
    return client, token


def api_client_revoke(*, name: str, actor: str = PYTHON_ACTOR, client_ip: str | None = None) -> ApiClient:
    """Revoke ``name``'s token for ``actor``: it stops working at once.

    Raises ``ApiClientError`` (audited as a refusal) for an unknown client or one revoked already: a second
    revoke changes nothing, and saying so tells the operator that someone acted first.
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(name=name).first()
        if client is not None and client.revoked_at is None:
            client.revoked_at = timezone.now()
            client.save(update_fields=["revoked_at"])
            _changed(client, REVOKED, actor, client_ip)
            return client
    if client is None:
        error = _no_such_client(name)
    else:
        error = ApiClientError(f"client {name!r} was revoked already", code="client_already_revoked")
    raise _refused(error, name=name, action=REVOKED, actor=actor, client_ip=client_ip)


def api_client_authenticate(*, token: str) -> ApiClient | None:
    """The active client holding ``token``, or None."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None
    digest = token_hash(token)
    client = ApiClient.objects.filter(token_hash=digest, revoked_at__isnull=True).first()
    if client is None or not hmac.compare_digest(client.token_hash, digest):
        return None
    return client


def api_client_signing_secret(
    *, name: str, rotate: bool = False, actor: str = PYTHON_ACTOR, client_ip: str | None = None
) -> str:
    """The client's callback signing secret, made on first use.

    ``rotate`` makes a new one for ``actor`` (audited, as is the refusal of an
    unknown client's); the one it replaces keeps signing callbacks (a second
    ``v1=``) for ``RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS``, so receivers
    can switch without refusing a callback. Making the first secret is not a
    change a receiver must follow (the first callback would make it anyway,
    ``api_client_signing_secret_ensure``), so it sends nothing.
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(name=name).first()
        if client is not None:
            if client.signing_secret and not rotate:
                return client.signing_secret
            fields = ["signing_secret"]
            if client.signing_secret:
                grace = timedelta(seconds=engine_settings.CALLBACK_SECRET_GRACE_SECONDS)
                client.previous_signing_secret = client.signing_secret
                client.previous_signing_secret_expires_at = timezone.now() + grace
                fields += ["previous_signing_secret", "previous_signing_secret_expires_at"]
            client.signing_secret = _new_signing_secret()
            client.save(update_fields=fields)
            if rotate:
                _changed(client, SECRET_ROTATED, actor, client_ip)
            return client.signing_secret
    error = _no_such_client(name)
    if rotate:
        raise _refused(error, name=name, action=SECRET_ROTATED, actor=actor, client_ip=client_ip)
    raise error


def api_client_signing_secret_ensure(*, client: ApiClient) -> None:
    """Give ``client`` a signing secret if it has none yet (a callback is never sent unsigned)."""
    if client.signing_secret:
        return
    ApiClient.objects.filter(pk=client.pk, signing_secret="").update(signing_secret=_new_signing_secret())
    client.refresh_from_db(fields=["signing_secret"])


def signing_secrets(client: ApiClient) -> list[str]:
    """The secrets a callback is signed with now: the current one, and the previous one in its grace period."""
    current = [client.signing_secret] if client.signing_secret else []
    expires = client.previous_signing_secret_expires_at
    if client.previous_signing_secret and expires is not None and expires > timezone.now():
        return [*current, client.previous_signing_secret]
    return current


def _new_signing_secret() -> str:
    return SIGNING_SECRET_PREFIX + secrets.token_urlsafe(32)


def _no_such_client(name: str) -> ApiClientError:
    return ApiClientError(f"no client named {name!r}", code="no_such_client")


def _changed(client: ApiClient, action: str, actor: str, client_ip: str | None) -> None:
    api_client_changed.send(sender=ApiClient, client=client, action=action, actor=actor, client_ip=client_ip)


def _refused(error: ApiClientError, *, name: str, action: str, actor: str, client_ip: str | None) -> ApiClientError:
    """Tell the receivers of ``error``'s refusal and return it for the caller to raise."""
    error.details = {"client": name, **error.details}
    api_client_refused.send(sender=ApiClient, name=name, action=action, actor=actor, error=error, client_ip=client_ip)
    return error
