from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

CONSOLE_INDEX_TEMPLATE = "dlq/admin/index.html"


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = _("Dead-letter queue")

    def import_models(self) -> None:
        # The console's models are views of the engine's (dlq.models imports tasks.models): without the engine
        # installed, one line naming the fix instead of a RuntimeError from deep inside a model import.
        from django.apps import apps
        from django.core.exceptions import ImproperlyConfigured

        if not apps.is_installed("tasks"):
            raise ImproperlyConfigured(
                'INSTALLED_APPS lists dlq without tasks: the console needs the engine; add "tasks" before "dlq"'
            )
        super().import_models()

    def ready(self) -> None:
        # The console composes the engine: it registers its pipeline, its RQ
        # entry point and its sweeper chores in every process (web, workers,
        # the sweeper), whatever RELIABILITY_PIPELINE_MODULES says, and audits
        # every cancel, pipeline control change and API client change, whoever asked for it.
        from django.contrib import admin

        from dlq import checks, chores, client_audit, control_audit  # noqa: F401 (checks: registers them)
        from dlq.alerting import pipeline
        from dlq.bulk import RUN_BULK_ENTRY_POINT
        from tasks import registry

        pipeline.register()
        registry.entry_point_register(RUN_BULK_ENTRY_POINT)
        chores.chores_register()
        control_audit.receivers_connect()
        client_audit.receivers_connect()
        # The index with the console's Operations module, under a name of the console's own: Django's app template
        # loader takes the first app in INSTALLED_APPS holding a name, so an override called admin/index.html would
        # lose to django.contrib.admin's whenever dlq is listed after it. A site's own index_template wins.
        if admin.site.index_template is None:
            admin.site.index_template = CONSOLE_INDEX_TEMPLATE
