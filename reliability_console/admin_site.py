"""The console's admin site: its name in every header and <title>, and third-party names in the reader's language.

Installed as Django's default admin site (``ConsoleAdminConfig`` in
``INSTALLED_APPS``), so every ``admin.register`` of the project and of the
libraries lands here.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

# Names that Django's admin and the libraries show but that their own catalogues
# do not translate into Chinese (yet): listed here so that makemessages puts them
# in the project's catalogue (tasks/locale/), which takes precedence (LOCALE_PATHS).
THIRD_PARTY_TEXTS = (
    # Django 5.2's app list table headers.
    gettext_noop("Model name"),
    gettext_noop("Add link"),
    gettext_noop("Change or view list link"),
    # django-axes' models.
    gettext_noop("access attempt"),
    gettext_noop("access attempts"),
    gettext_noop("access failure"),
    gettext_noop("access failures"),
    gettext_noop("access log"),
    gettext_noop("access logs"),
)
# Apps and models whose names are plain English strings in their library (not translatable there).
APP_NAMES = {
    "axes": _("Login protection (django-axes)"),
    "django_rq": _("Job queues (django-rq)"),
}
MODEL_NAMES = {("django_rq", "dashboard"): _("RQ dashboard")}


class ConsoleAdminSite(admin.AdminSite):
    site_header = _("Reliability Console")
    site_title = _("Reliability Console")
    index_title = _("Reliability Console")

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        for app in apps:
            app["name"] = APP_NAMES.get(app["app_label"], app["name"])
            for model in app["models"]:
                key = (app["app_label"], model["object_name"].lower())
                model["name"] = MODEL_NAMES.get(key, model["name"])
        return apps


class ConsoleAdminConfig(AdminConfig):
    default_site = "reliability_console.admin_site.ConsoleAdminSite"

    def ready(self) -> None:
        super().ready()
        # Django 6.1 labels a select's empty choice "- Select an option -", which its Chinese catalogue does not
        # translate; the standalone console keeps the dashes of 5.2 and 6.0 on every version. Django's own way
        # to choose the label: an app's ready() sets BLANK_CHOICE_LABEL (absent before 6.1).
        from django.db.models import fields

        if hasattr(fields, "BLANK_CHOICE_LABEL"):
            fields.BLANK_CHOICE_LABEL = fields.BLANK_CHOICE_DASH[0][1]
