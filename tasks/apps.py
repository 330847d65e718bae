from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = _("Tasks")

    def ready(self) -> None:
        # Importing the pipeline modules registers their pipelines, in the web
        # process and in every worker alike: a worker runs only what is registered.
        from django.conf import settings

        from tasks import callback_pipeline, registry
        from tasks.retention import finished_tasks_purge_due
        from tasks.sweeper import Chore, chore_register

        registry.load_pipeline_modules()
        # The engine's own pipeline (completion callbacks), in every process like the console's.
        callback_pipeline.register()
        # The engine's own interval chore: the retention purge of finished tasks.
        chore_register(
            Chore(
                "finished_tasks_purged", finished_tasks_purge_due, interval=settings.RELIABILITY_PURGE_INTERVAL_SECONDS
            )
        )
