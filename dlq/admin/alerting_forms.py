"""The alert channel's form: where the channel would send is checked before it is saved."""

from __future__ import annotations

from functools import partial

from django import forms

from dlq.alerting.models import AlertChannel
from dlq.alerting.url_checks import channel_url_errors


class AlertChannelForm(forms.ModelForm):
    class Meta:
        model = AlertChannel
        fields = ("name", "kind", "enabled", "url", "secret", "email_to")
        field_classes = {"url": partial(forms.URLField, assume_scheme="https")}  # Django 6's default, stated now

    def clean(self):
        cleaned = super().clean()
        if "url" in self.fields and "url" not in self.errors and "kind" not in self.errors:
            errors = channel_url_errors(kind=cleaned.get("kind", ""), url=cleaned.get("url") or "")
            for field, message in errors.items():
                self.add_error(field, message)
        if not self.errors and cleaned.get("enabled"):
            # A supervisor switching the channel on again with a URL that passes: the engine's reason is history.
            self.instance.disabled_reason_code, self.instance.disabled_reason_params = "", {}
            self.instance.disabled_at = None
        return cleaned
