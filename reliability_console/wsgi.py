import os

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application
from gunicorn.errors import AppImportError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
try:
    application = get_wsgi_application()
except ImproperlyConfigured as exc:
    # gunicorn prints an AppImportError as its message alone and stops ("App
    # failed to load", exit 4); any other error it logs with a traceback per
    # worker. A bad setting or pipeline module is one line, like manage.py's.
    raise AppImportError(f"configuration error: {exc}") from None
