"""Users of each console role (viewer, operator, supervisor, and a second supervisor for four eyes); an API token."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from dlq.roles import roles_setup
from tasks.lifecycle.clients import api_client_create


@pytest.fixture
def token():
    """The bearer token of a new API client, ``client-a``."""
    return api_client_create(name="client-a")[1]


@pytest.fixture
def role_users(db):
    roles_setup()
    made = {}
    for name, role in (("viewer", "viewer"), ("operator", "operator"), ("supervisor", "supervisor")):
        user = get_user_model().objects.create_user(f"{name}-r", password="x-test-only", is_staff=True)
        user.groups.add(Group.objects.get(name=role))
        made[name] = user
    second = get_user_model().objects.create_user("supervisor-r2", password="x-test-only", is_staff=True)
    second.groups.add(Group.objects.get(name="supervisor"))
    made["supervisor2"] = second
    made["superuser"] = get_user_model().objects.create_superuser("root-r", password="x-test-only")
    return made


@pytest.fixture
def fresh_statement_state(monkeypatch):
    """The process as one that has met no transaction pooler and made no stored function yet
    (``tasks.lifecycle.fenced_writes`` keeps both for the life of a process)."""
    from tasks.lifecycle import fenced_writes

    monkeypatch.setattr(fenced_writes, "_pooler_seen", False)
    monkeypatch.setattr(fenced_writes, "_functions", set())
    monkeypatch.setattr(fenced_writes, "_functions_refused", False)
