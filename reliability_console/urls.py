from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    # The console's pages live under admin/ at this mount: before the admin site, whose catch-all would answer them.
    path("", include("dlq.urls")),
    path("admin/", admin.site.urls),
]
