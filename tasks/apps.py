from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = _("Tasks")

    def ready(self) -> None:
        # Importing the pipeline modules registers their pipelines, in the web
        # process and in every worker alike: a worker runs only what is registered.
        from django.conf import settings

        from tasks import checks, registry  # noqa: F401 (checks: registers the system checks)
        from tasks.conf import engine_settings
        from tasks.lifecycle.retention import finished_tasks_purge_due
        from tasks.observability import tracing
        from tasks.outbound import callback_sending

        registry.load_pipeline_modules()
        # Django's Tasks framework run by the engine (tasks.backends): its pipelines, in every process.
        # Imported only when configured: the framework is optional on Django 5.2 (the django-tasks backport).
        ours = [
            alias
            for alias, params in (getattr(settings, "TASKS", None) or {}).items()
            if params.get("BACKEND") == "tasks.backends.ReliabilityBackend"
        ]
        if ours:
            from tasks.backends import configured_backends_load

            configured_backends_load(ours)
        # The engine's own pipeline (completion callbacks), in every process like the console's.
        callback_sending.register()
        # Traces (tasks.observability.tracing): on in this process when RELIABILITY_TRACING asks and the SDK is
        # installed.
        tracing.tracing_configure()
        # The engine's own interval chore: the retention purge of finished tasks.
        registry.chore_register(
            registry.Chore(
                "finished_tasks_purged", finished_tasks_purge_due, interval=engine_settings.PURGE_INTERVAL_SECONDS
            )
        )
