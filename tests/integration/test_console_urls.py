"""The console's pages and the engine's API come from one include(), and work under any prefix.

The URLconfs here are an embedding project's (``ops/`` beside its own ``admin/``) and a project that has not
mounted the console yet; the standalone project's own addresses are the other integration tests'.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import include, path, reverse

pytestmark = pytest.mark.django_db

EMBEDDED = "tests.integration.embedded_urls"
ADMIN_ONLY = "tests.integration.admin_only_urls"


def _urlconf(name: str, patterns: list) -> None:
    module = types.ModuleType(name)
    module.urlpatterns = patterns
    sys.modules[name] = module


@pytest.fixture
def superuser_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    return client


@pytest.fixture
def embedded(settings):
    _urlconf(EMBEDDED, [path("ops/", include("dlq.urls")), path("admin/", admin.site.urls)])
    settings.ROOT_URLCONF = EMBEDDED


@pytest.fixture
def admin_only(settings):
    _urlconf(ADMIN_ONLY, [path("admin/", admin.site.urls)])
    settings.ROOT_URLCONF = ADMIN_ONLY


def test_the_standalone_project_keeps_its_addresses():
    assert reverse("dashboard") == "/admin/dashboard/"
    assert reverse("queues") == "/admin/queues/"
    assert reverse("pipelines") == "/admin/pipelines/"
    assert reverse("pipeline_act", args=["p", "pause"]) == "/admin/pipelines/p/act/pause/"
    assert reverse("metrics") == "/metrics"
    assert reverse("api-v1:get_task", args=["00000000-0000-0000-0000-000000000000"]).startswith("/api/v1/tasks/")


def test_under_a_prefix_the_admin_index_links_to_the_pages_where_they_are_mounted(embedded, superuser_client):
    index = superuser_client.get("/admin/")
    assert index.status_code == 200
    body = index.content.decode()
    for page in ("/ops/admin/dashboard/", "/ops/admin/queues/", "/ops/admin/pipelines/"):
        assert f'href="{page}"' in body
        assert superuser_client.get(page).status_code == 200
    # The models and actions are on the project's own admin site, at its own address.
    assert superuser_client.get("/admin/dlq/dlqitem/").status_code == 200
    assert superuser_client.get("/admin/tasks/task/").status_code == 200


def test_under_a_prefix_the_api_answers_json(embedded, client):
    unauthenticated = client.get("/ops/api/v1/tasks")
    assert unauthenticated.status_code == 401
    missing = client.get("/ops/api/v2/nothing")
    assert missing.status_code == 404
    assert json.loads(missing.content)["error"]["code"] == "not_found"
    assert client.get("/ops/metrics").status_code != 404


def test_an_admin_without_the_include_still_renders_its_index(admin_only, superuser_client):
    index = superuser_client.get("/admin/")
    assert index.status_code == 200
    assert b"operator-dashboard-module" not in index.content
