from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = _("Dead-letter queue")
