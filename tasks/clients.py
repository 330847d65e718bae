"""API clients and their bearer tokens. Only a SHA-256 of each token is stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.db import IntegrityError, transaction
from django.utils import timezone

from tasks.exceptions import ReliabilityError
from tasks.models import ApiClient

TOKEN_PREFIX = "rc_"
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
