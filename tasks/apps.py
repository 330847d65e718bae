from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = _("Tasks")

    def ready(self) -> None:
        # Importing the pipeline modules registers their pipelines, in the web
        # process and in every worker alike: a worker runs only what is registered.
        from tasks import registry

        registry.load_pipeline_modules()
