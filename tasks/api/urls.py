"""The engine's HTTP API under one include(): ``path("api/", include("tasks.api.urls"))`` gives ``/api/v1/…``.

An engine-only deployment mounts this alone; the console's ``dlq.urls`` includes it, so a project with the
console mounts one URLconf. ``api.urls`` is read here once per process: django-ninja refuses a second reading.
"""

from django.urls import path, re_path

from tasks.api.views import api, not_found

urlpatterns = [
    path("v1/", api.urls),
    # Any other address under the API's prefix answers the API's JSON 404, not the site's HTML one.
    re_path(r"^", not_found),
]
