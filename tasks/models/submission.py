"""Who submits tasks and what they asked: API clients and submission idempotency records."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class ApiClient(models.Model):
    """A program that calls the HTTP API with a bearer token (only its hash is stored)."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    token_hash = models.CharField(_("token hash"), max_length=64, unique=True)
    token_prefix = models.CharField(
        _("token prefix"), max_length=12, help_text=_("first characters, to recognise a token")
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)
    # The HMAC key of the client's completion callbacks (tasks.outbound.callback_events). Stored as is (an HMAC
    # needs the key itself); after a rotation the previous one signs too until it expires.
    signing_secret = models.CharField(_("signing secret"), max_length=100, blank=True, default="")
    previous_signing_secret = models.CharField(_("previous signing secret"), max_length=100, blank=True, default="")
    previous_signing_secret_expires_at = models.DateTimeField(
        _("previous signing secret expires"), null=True, blank=True
    )

    class Meta:
        verbose_name = _("API client")
        verbose_name_plural = _("API clients")
        ordering = ["name"]
        # One permission for making, revoking and re-keying clients: each of them can stop (or let in) all of a
        # client's traffic and callbacks, so none is a plain "change" a role might hold for another reason.
        permissions = [("manage_apiclient", _("Can create and revoke API clients and rotate their signing secrets"))]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class IdempotencyState(models.TextChoices):
    IN_PROGRESS = "in_progress", _("in progress")
    COMPLETED = "completed", _("completed")


class IdempotencyRecord(models.Model):
    """One logical request of one client: its fingerprint, the task it made and the first response."""

    scope = models.CharField(max_length=100, help_text=_('"python" or "client:<id>"'))
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=20, choices=IdempotencyState.choices, default=IdempotencyState.IN_PROGRESS)
    task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    replay_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    locked_at = models.DateTimeField(default=timezone.now, help_text=_("when the owner started processing"))
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_unique_scope_key")]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expires_idx")]

    def __str__(self) -> str:
        return f"{self.scope}/{self.key} ({self.state})"
