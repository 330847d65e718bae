"""Alerting's pages: rules and channels (configuration, for supervisors), the event history with its deliveries."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import model_ngettext
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.admin.alerting_forms import AlertChannelForm
from dlq.admin.common import DenialsAuditedMixin, client_ip
from dlq.alerting.change_texts import delivery_error_text, url_refusal_text
from dlq.alerting.channels import notification_payload
from dlq.alerting.config_changes import (
    TARGET_TYPES,
    alert_channel_test,
    alert_config_delete,
    alert_config_enabled_set,
    alert_config_save,
)
from dlq.alerting.masking import secret_masked, secrets_scrubbed, url_masked
from dlq.alerting.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule
from dlq.alerting.url_checks import disabled_text
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from reliability_console.json_display import json_text

# A test notification is sent while the page waits (up to channels.TEST_SEND_TIMEOUT_SECONDS each): a few at once.
MAX_TESTED_CHANNELS = 3


class AlertConfigAdmin(DenialsAuditedMixin, admin.ModelAdmin):
    """Rules' and channels' pages: each save, deletion and list action is one call to
    ``dlq.alerting.config_changes``, which writes the change and its audit entry in one transaction."""

    actions = ["enable", "disable"]

    def save_model(self, request, obj, form, change):
        alert_config_save(
            record=obj,
            changed_fields=list(form.changed_data) if change else None,
            channels=form.cleaned_data.get("channels"),
            actor=request.user.get_username(),
            client_ip=client_ip(request),
        )

    def delete_model(self, request, obj):
        alert_config_delete(records=[obj], actor=request.user.get_username(), client_ip=client_ip(request))

    def delete_queryset(self, request, queryset):
        alert_config_delete(records=list(queryset), actor=request.user.get_username(), client_ip=client_ip(request))

    @admin.action(description=_("Enable"), permissions=["change"])
    def enable(self, request, queryset):
        self._enabled_set(request, queryset, enabled=True)

    @admin.action(description=_("Disable"), permissions=["change"])
    def disable(self, request, queryset):
        self._enabled_set(request, queryset, enabled=False)

    def _enabled_set(self, request, queryset, *, enabled: bool) -> None:
        result = alert_config_enabled_set(
            model=self.model,
            ids=list(queryset.values_list("pk", flat=True)),
            enabled=enabled,
            actor=request.user.get_username(),
            client_ip=client_ip(request),
        )
        if result.changed:
            done = _("Enabled %(count)d %(items)s.") if enabled else _("Disabled %(count)d %(items)s.")
            count = len(result.changed)
            self.message_user(request, done % {"count": count, "items": model_ngettext(self.opts, count)})
        if result.unchanged:
            same = (
                _("%(count)d already enabled: unchanged.") if enabled else _("%(count)d already disabled: unchanged.")
            )
            self.message_user(request, same % {"count": len(result.unchanged)}, messages.WARNING)
        for name, refusal in result.refused.items():
            why = url_refusal_text(refusal)
            self.message_user(
                request, gettext("Not enabled: %(name)s: %(why)s") % {"name": name, "why": why}, messages.ERROR
            )


@admin.register(AlertRule)
class AlertRuleAdmin(AlertConfigAdmin):
    audit_target_type = TARGET_TYPES[AlertRule]
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


# Credentials of a channel: shown whole only to those who may change the channel (dlq.alerting.masking).
SECRET_FIELDS = ("url", "secret")


@admin.register(AlertChannel)
class AlertChannelAdmin(AlertConfigAdmin):
    audit_target_type = TARGET_TYPES[AlertChannel]
    actions = ["enable", "disable", "test"]
    form = AlertChannelForm
    list_display = ("name", "kind", "enabled", "consecutive_failures", "total_failures", "last_failure_at", "health")
    list_filter = ("kind", "enabled")
    search_fields = ("name",)
    readonly_fields = (
        "switched_off",
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

    @admin.action(description=_("Send a test notification"), permissions=["change"])
    def test(self, request, queryset):
        channels = list(queryset[: MAX_TESTED_CHANNELS + 1])
        if len(channels) > MAX_TESTED_CHANNELS:
            too_many = _("Choose at most %(max)d channels to test at once: nothing was sent.")
            self.message_user(request, too_many % {"max": MAX_TESTED_CHANNELS}, messages.ERROR)
            return
        actor, address = request.user.get_username(), client_ip(request)
        for channel in channels:
            result = alert_channel_test(channel=channel, actor=actor, client_ip=address)
            if result.delivered:
                self.message_user(request, gettext("Test notification to %(name)s delivered.") % {"name": channel.name})
                continue
            why = delivery_error_text(code=result.error_code, message=result.error)
            text = gettext("Test notification to %(name)s not delivered: %(why)s") % {"name": channel.name, "why": why}
            self.message_user(request, text, messages.ERROR)

    @admin.display(description=_("URL"))
    def url_hint(self, obj):
        return url_masked(obj.url) or "-"

    @admin.display(description=_("secret"))
    def secret_hint(self, obj):
        return secret_masked(obj.secret) or "-"

    @admin.display(description=_("last error"))
    def last_error_text(self, obj):
        return secrets_scrubbed(obj.last_error, obj) or "-"

    @admin.display(description=_("switched off by the engine"))
    def switched_off(self, obj):
        return disabled_text(obj) or "-"

    @admin.display(description=_("health"))
    def health(self, obj):
        if obj.disabled_reason_code:
            return format_html('<strong style="color:#ba2121">{}</strong>', disabled_text(obj))
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
