"""Operator pages outside the model admin: the dashboard."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse


@staff_member_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Placeholder until the dashboard lands (see dlq/dashboard.py)."""
    return TemplateResponse(request, "admin/base_site.html", {**admin.site.each_context(request)})
