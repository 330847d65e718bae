"""Alerting's pages: rules and channels (configuration, for supervisors), the event history with its deliveries."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from dlq.admin.common import DenialsAuditedMixin
from dlq.alerting.channels import notification_payload
from dlq.alerting.masking import secret_masked, secrets_scrubbed, url_masked
from dlq.alerting.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from reliability_console.json_display import json_text


@admin.register(AlertRule)
class AlertRuleAdmin(DenialsAuditedMixin, admin.ModelAdmin):
    list_display = ("name", "kind", "pipeline", "threshold", "state", "last_value", "firing_since", "enabled")
    list_filter = ("state", "kind", "enabled")
    search_fields = ("name", "pipeline")
    filter_horizontal = ("channels",)
    readonly_fields = ("state", "last_value", "last_evaluated_at", "firing_since", "last_notified_at", "recent_events")
    fieldsets = (
        (None, {"fields": ("name", "kind", "pipeline", "enabled")}),
        (_("Condition"), {"fields": ("threshold", "window_seconds", "lookback_days")}),
        (_("Notifications"), {"fields": ("channels", "renotify_seconds")}),
        (
            _("State"),
            {
                "fields": (
                    "state",
                    "last_value",
                    "last_evaluated_at",
                    "firing_since",
                    "last_notified_at",
                    "recent_events",
                )
            },
        ),
    )

    @admin.display(description=_("recent history"))
    def recent_events(self, obj):
        if obj.pk is None:
            return "-"
        events = AlertEvent.objects.filter(rule=obj)[:10]
        return (
            format_html_join(
                "",
                '<div><a href="{}">{}</a> {} — {}</div>',
                (
                    (
                        reverse("admin:dlq_alertevent_change", args=[e.pk]),
                        e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                        e.get_kind_display(),
                        e.summary_shown,
                    )
                    for e in events
                ),
            )
            or "-"
        )

    def save_model(self, request, obj, form, change):
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Save only what the form changed and bump the version, so an evaluator that
        # read the rule before this edit loses its transition instead of undoing the edit.
        fields = [name for name in form.changed_data if name != "channels"]
        if fields:
            obj.save(update_fields=fields)
        AlertRule.objects.filter(pk=obj.pk).update(version=F("version") + 1)


# Credentials of a channel: shown whole only to those who may change the channel (dlq.alerting.masking).
SECRET_FIELDS = ("url", "secret")


@admin.register(AlertChannel)
class AlertChannelAdmin(DenialsAuditedMixin, admin.ModelAdmin):
    list_display = ("name", "kind", "enabled", "consecutive_failures", "total_failures", "last_failure_at", "health")
    list_filter = ("kind", "enabled")
    search_fields = ("name",)
    readonly_fields = (
        "consecutive_failures",
        "total_failures",
        "last_error_text",
        "last_failure_at",
        "last_success_at",
    )
    fields = ("name", "kind", "enabled", "url", "secret", "email_to", *readonly_fields)

    def get_fields(self, request, obj=None):
        if self.has_change_permission(request, obj) or obj is None:
            return self.fields
        return tuple({"url": "url_hint", "secret": "secret_hint"}.get(name, name) for name in self.fields)

    def get_readonly_fields(self, request, obj=None):
        if self.has_change_permission(request, obj) or obj is None:
            return self.readonly_fields
        return (*self.readonly_fields, "url_hint", "secret_hint")

    def lookup_allowed(self, lookup, value, request=None):
        # ?secret__startswith=… would answer "is this the next character?" through the row count.
        if lookup.split("__", 1)[0] in SECRET_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "url":
            kwargs["assume_scheme"] = "https"  # Django 6's default, stated now
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description=_("URL"))
    def url_hint(self, obj):
        return url_masked(obj.url) or "-"

    @admin.display(description=_("secret"))
    def secret_hint(self, obj):
        return secret_masked(obj.secret) or "-"

    @admin.display(description=_("last error"))
    def last_error_text(self, obj):
        return secrets_scrubbed(obj.last_error, obj) or "-"

    @admin.display(description=_("health"))
    def health(self, obj):
        if obj.consecutive_failures:
            error = secrets_scrubbed(obj.last_error, obj)[:120]
            return format_html('<strong style="color:#ba2121">{}</strong>', _("failing: %(error)s") % {"error": error})
        return _("ok")


class AlertDeliveryInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = AlertDelivery
    extra = 0
    fields = ("channel", "status", "attempts", "error", "delivered_at", "task")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("channel")

    @admin.display(description=_("last error"))
    def error(self, obj):
        return secrets_scrubbed(obj.last_error, obj.channel) or "-"


@admin.register(AlertEvent)
class AlertEventAdmin(DenialsAuditedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "rule", "kind", "value", "threshold", "delivery_status")
    list_filter = ("kind", "rule")
    list_select_related = ("rule",)
    inlines = [AlertDeliveryInline]
    fields = ("rule", "kind", "value", "threshold", "summary_text", "created_at", "dlq_items", "notification")
    readonly_fields = fields

    @admin.display(description=_("notifications"))
    def delivery_status(self, obj):
        statuses = [d.get_status_display() for d in obj.deliveries.all()]
        return ", ".join(statuses) or "-"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("deliveries")

    @admin.display(description=_("summary"))
    def summary_text(self, obj):
        return obj.summary_shown

    @admin.display(description=_("notification sent (JSON)"))
    def notification(self, obj):
        return format_html(
            '<pre class="rc-json" style="white-space:pre-wrap;overflow-wrap:anywhere">{}</pre>',
            json_text(notification_payload(obj)),
        )

    @admin.display(description=_("dead letters"))
    def dlq_items(self, obj):
        return (
            format_html_join(
                ", ",
                '<a href="{}">{}</a>',
                ((reverse("admin:dlq_dlqitem_change", args=[pk]), pk) for pk in obj.dlq_item_ids),
            )
            or "-"
        )
