from django.urls import path

from tasks.api.views import api

urlpatterns = [path("api/v1/", api.urls)]
