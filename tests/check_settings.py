"""The standalone settings without the names listed in RC_CHECK_DROP (comma-separated), for check tests.

``RC_CHECK_DROP=RQ_QUEUES`` is a project that forgot django-rq's queues; an app label in the list
(``tasks``) is taken out of ``INSTALLED_APPS`` instead.
"""

import os

from reliability_console.settings import *  # noqa: F403

for _name in filter(None, os.environ.get("RC_CHECK_DROP", "").split(",")):
    if _name.isupper():
        del globals()[_name]
    else:
        INSTALLED_APPS = [app for app in INSTALLED_APPS if app.split(".")[0] != _name]  # noqa: F405
