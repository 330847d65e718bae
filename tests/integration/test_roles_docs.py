"""The role table of docs/operate-dlq.md, ``dlq.roles.ROLES`` and the groups ``setup_roles`` makes agree."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from dlq.roles import ROLES
from tests.support import ROOT

GROUP_ROLES = ("viewer", "operator", "supervisor")
CODE = re.compile(r"`([a-z_]+\.[a-z_]+)`")


def docs_role_table() -> dict[str, list[str]]:
    """Each row of the operator's guide's role table: its role and the permission codes of its last column."""
    guide = (ROOT / "docs" / "operate-dlq.md").read_text(encoding="utf-8").split("\n## Roles\n", 1)[1]
    lines = guide.split("\n## ", 1)[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| role |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0]] = CODE.findall(cells[-1])
    return rows


def docs_roles() -> dict[str, list[str]]:
    """The groups' permissions as the docs give them: each role holds its own and those of the roles above."""
    rows, held, roles = docs_role_table(), [], {}
    for role in GROUP_ROLES:
        held = held + rows[role]
        roles[role] = held
    return roles


def test_the_docs_list_exactly_the_permissions_of_each_role():
    assert docs_roles() == ROLES


def test_managing_api_clients_is_in_no_role_and_the_docs_say_only_superusers_hold_it():
    assert not any("tasks.manage_apiclient" in codes for codes in ROLES.values())
    assert not any("tasks.change_apiclient" in codes for codes in ROLES.values())
    superuser_row = next(codes for role, codes in docs_role_table().items() if role.startswith("superuser"))
    assert superuser_row == ["tasks.manage_apiclient"]


@pytest.mark.django_db
def test_setup_roles_gives_each_group_exactly_the_documented_permissions():
    call_command("setup_roles")
    for role, codes in docs_roles().items():
        permissions = Group.objects.get(name=role).permissions.select_related("content_type")
        held = {f"{permission.content_type.app_label}.{permission.codename}" for permission in permissions}
        assert held == set(codes), role
