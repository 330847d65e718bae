from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = _("Dead-letter queue")

    def ready(self) -> None:
        # Alert notifications run on the engine: every process (web, workers,
        # the sweeper) knows the pipeline, whatever RELIABILITY_PIPELINE_MODULES says.
        from dlq import alert_pipeline

        alert_pipeline.register()
