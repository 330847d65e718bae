"""API clients, their bearer tokens and their callback signing secrets.

Only a SHA-256 of each token is stored. A signing secret is stored as is (an
HMAC needs the key): it is shown by ``manage.py callback_secret`` and never
logged, nor shown whole in the admin.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from tasks.exceptions import ReliabilityError
from tasks.models import ApiClient

TOKEN_PREFIX = "rc_"
# Marks a callback signing secret for what it is (in a leaked text, a secret scanner's rule).
SIGNING_SECRET_PREFIX = "whsec_"
MAX_TOKEN_LENGTH = 200


class ApiClientError(ReliabilityError):
    code = "api_client_error"


def token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a plain hash cannot be brute-forced.
    return hashlib.sha256(token.encode()).hexdigest()


def api_client_create(*, name: str) -> tuple[ApiClient, str]:
    """Create a client; return it and its token (shown once, never stored)."""
    name = name.strip()
    if not 1 <= len(name) <= 100:
        raise ApiClientError("client name must be 1 to 100 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            client = ApiClient.objects.create(name=name, token_hash=token_hash(token), token_prefix=token[:10])
    except IntegrityError:
        raise ApiClientError(f"a client named {name!r} already exists") from None
    return client, token


def api_client_revoke(*, name: str) -> ApiClient:
    client = ApiClient.objects.filter(name=name).first()
    if client is None:
        raise ApiClientError(f"no client named {name!r}")
    if client.revoked_at is None:
        client.revoked_at = timezone.now()
        client.save(update_fields=["revoked_at"])
    return client


def api_client_authenticate(*, token: str) -> ApiClient | None:
    """The active client holding ``token``, or None."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None
    digest = token_hash(token)
    client = ApiClient.objects.filter(token_hash=digest, revoked_at__isnull=True).first()
    if client is None or not hmac.compare_digest(client.token_hash, digest):
        return None
    return client


def api_client_signing_secret(*, name: str, rotate: bool = False) -> str:
    """The client's callback signing secret, made on first use.

    ``rotate`` makes a new one; the one it replaces keeps signing callbacks
    (a second ``v1=``) for ``RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS``, so
    receivers can switch without refusing a callback.
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(name=name).first()
        if client is None:
            raise ApiClientError(f"no client named {name!r}")
        if client.signing_secret and not rotate:
            return client.signing_secret
        fields = ["signing_secret"]
        if client.signing_secret:
            grace = timedelta(seconds=settings.RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS)
            client.previous_signing_secret = client.signing_secret
            client.previous_signing_secret_expires_at = timezone.now() + grace
            fields += ["previous_signing_secret", "previous_signing_secret_expires_at"]
        client.signing_secret = _new_signing_secret()
        client.save(update_fields=fields)
        return client.signing_secret


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
