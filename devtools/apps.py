from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    name = "devtools"
    label = "devtools"
    # Not marked for translation: a development tool, and it has no models for the admin to show.
    verbose_name = "Development tools"
