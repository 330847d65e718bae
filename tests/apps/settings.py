"""An embedding project's settings: its own app with a ``pipelines.py``, and no ``RELIABILITY_PIPELINE_MODULES``.

tests/integration/test_pipeline_discovery.py: the app's pipelines are found and neither the demo nor the bench
pipelines are registered, which only the standalone project's settings ask for.
"""

from reliability_console.settings import *  # noqa: F403
from reliability_console.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.apps.shop"]
del RELIABILITY_PIPELINE_MODULES  # noqa: F821
