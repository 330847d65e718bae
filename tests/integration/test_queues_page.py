"""RQ's admin views are gone: a read-only Queues page instead, and no way to touch Redis from the console."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from dlq.models import AuditEntry, AuditOutcome
from tasks.delivery.enqueue import get_queue, redis_client
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

EVIL = "https://evil.example/phish"


def redis_snapshot() -> dict:
    redis = redis_client()
    return {key: redis.dump(key) for key in sorted(redis.keys("*"))}


@pytest.fixture
def jobs(clean_redis):
    """Two tasks' jobs waiting in the queue, one of them also in the failed registry."""
    task_submit(pipeline="t_local", input={})
    task_submit(pipeline="t_local", input={"n": 2})
    queue = get_queue()
    job_ids = queue.get_job_ids()
    assert len(job_ids) == 2
    queue.failed_job_registry.add(queue.fetch_job(job_ids[1]), ttl=3600, exc_string="boom")
    return job_ids


def mutating_urls(prefix: str, job_id: str) -> list[tuple[str, dict]]:
    return [
        (f"{prefix}queues/0/empty/", {}),
        (f"{prefix}queues/0/requeue-all/", {}),
        (f"{prefix}queues/0/failed/clear/", {}),
        (f"{prefix}queues/0/{job_id}/delete/", {"post": "yes"}),
        (f"{prefix}queues/0/{job_id}/requeue/", {"requeue": "yes"}),
        (f"{prefix}queues/0/{job_id}/enqueue/", {}),
        (f"{prefix}queues/0/{job_id}/stop/", {}),
        (f"{prefix}queues/actions/0/", {"action": "delete", "job_ids": [job_id], "next_url": EVIL}),
        (f"{prefix}queues/confirm-action/0/", {"action": "delete", "_selected_action": [job_id]}),
    ]


@pytest.mark.parametrize("prefix", ["/admin/rq/", "/admin/django_rq/dashboard/"])
def test_a_viewer_cannot_change_redis_through_rq_views_and_is_not_redirected_away(
    client, role_users, jobs, clean_redis, prefix
):
    client.force_login(role_users["viewer"])
    before = redis_snapshot()
    urls = mutating_urls(prefix, jobs[1])
    for url, data in urls:
        response = client.post(url, data, HTTP_REFERER=EVIL)
        assert response.status_code in (403, 404), url
        assert "evil.example" not in response.get("Location", ""), url
    assert client.get(prefix).status_code == 404  # no RQ page at all, read-only ones included
    assert redis_snapshot() == before
    assert get_queue().count == 2 and get_queue().failed_job_registry.get_job_count(cleanup=False) == 1
    denied = AuditEntry.objects.filter(actor="viewer-r", outcome=AuditOutcome.DENIED, action="rq_admin_removed")
    assert denied.count() == len(urls)


def test_even_a_superuser_gets_no_rq_action(client, role_users, jobs, clean_redis):
    client.force_login(role_users["superuser"])
    before = redis_snapshot()
    for url, data in mutating_urls("/admin/rq/", jobs[0]):
        assert client.post(url, data).status_code == 404, url
    assert redis_snapshot() == before


def test_the_queues_page_shows_depth_oldest_job_registries_and_workers_read_only(client, role_users, jobs):
    client.force_login(role_users["viewer"])
    page = client.get("/admin/queues/")
    assert page.status_code == 200
    body = page.content.decode()
    section = body.split('id="queue-default"')[1]
    assert '<td class="queue-depth">2</td>' in section
    assert '<td class="queue-failed">1</td>' in section and '<td class="queue-scheduled">0</td>' in section
    assert "old" in section.split('class="queue-oldest">')[1].split("</td>")[0]
    assert "queue-no-workers" in section  # no worker is running in this test
    # The only form on the page is the admin's log-out form.
    assert body.count("<form") == 1 and 'id="logout-form"' in body
    assert 'id="queues-link"' in client.get("/admin/").content.decode()


def test_the_queues_page_needs_the_task_view_permission(client, role_users):
    nobody = get_user_model().objects.create_user("staff-without-role", password="x-test-only", is_staff=True)
    client.force_login(nobody)
    assert client.get("/admin/queues/").status_code == 403
    client.logout()
    assert client.get("/admin/queues/").status_code == 302  # to the login page
