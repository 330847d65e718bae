"""Read-only task pages: nobody edits a task's fields by hand (state changes go through services)."""

from __future__ import annotations

from django.contrib import admin, messages

from reliability_console.admin_mixins import ReadOnlyAdminMixin
from tasks.clients import api_client_revoke
from tasks.models import ApiClient, Checkpoint, SideEffect, StepAttempt, Task
from tasks.redaction import redact


class ReadOnlyInline(ReadOnlyAdminMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False


class StepAttemptInline(ReadOnlyInline):
    model = StepAttempt
    # The traceback stays server-side: it is not listed here.
    fields = (
        "kind",
        "step_index",
        "step_name",
        "attempt",
        "outcome",
        "error_code",
        "error_message",
        "started_at",
        "finished_at",
        "retry_delay_seconds",
        "worker",
    )
    readonly_fields = fields


class CheckpointInline(ReadOnlyInline):
    model = Checkpoint
    fields = ("step_index", "step_name", "redacted_output", "created_at")
    readonly_fields = fields

    @admin.display(description="output")
    def redacted_output(self, obj: Checkpoint):
        return redact(obj.output)


class SideEffectInline(ReadOnlyInline):
    model = SideEffect
    fields = ("generation", "step_name", "effect_name", "effect_key", "status", "compensated_at")
    readonly_fields = fields


@admin.register(Task)
class TaskAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "pipeline", "state", "current_step", "total_steps", "failure_reason", "created_at")
    list_filter = ("state", "pipeline", "failure_reason")
    search_fields = ("=id", "idempotency_key", "failure_message")
    date_hierarchy = "created_at"
    show_full_result_count = False
    inlines = (StepAttemptInline, CheckpointInline, SideEffectInline)
    exclude = ("input", "result")
    readonly_fields = (
        "id",
        "pipeline",
        "state",
        "redacted_input",
        "redacted_result",
        "current_step",
        "total_steps",
        "step_attempt",
        "total_attempts",
        "generation",
        "deadline",
        "retry_at",
        "lease_owner",
        "lease_expires_at",
        "fencing_token",
        "crash_count",
        "failure_reason",
        "failure_code",
        "failure_message",
        "failed_step",
        "idempotency_scope",
        "idempotency_key",
        "request_fingerprint",
        "created_at",
        "updated_at",
        "finished_at",
    )

    @admin.display(description="input")
    def redacted_input(self, obj: Task):
        return redact(obj.input)

    @admin.display(description="result")
    def redacted_result(self, obj: Task):
        return redact(obj.result)


@admin.register(ApiClient)
class ApiClientAdmin(admin.ModelAdmin):
    """API clients: created with ``manage.py create_api_token``; revoked here or with ``revoke_api_token``."""

    list_display = ("name", "token_prefix", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name",)
    readonly_fields = ("name", "token_prefix", "created_at", "revoked_at")
    exclude = ("token_hash",)
    actions = ("revoke",)

    @admin.action(description="Revoke the selected clients' tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for client in queryset:
            api_client_revoke(name=client.name)
        self.message_user(request, f"revoked {queryset.count()} client(s)", messages.SUCCESS)

    def has_add_permission(self, request) -> bool:
        return False  # tokens are shown once, by the command that creates them

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: tasks keep pointing at their client
