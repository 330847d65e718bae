"""A pipeline names one of the configured queues; the workers the project starts listen to all of them in order."""

from __future__ import annotations

import pytest
from django.conf import settings

from chaos.processes import WORKER_QUEUES, worker_argv
from tasks import Pipeline
from tasks.delivery.queues import queues_above
from tasks.exceptions import ConfigurationError


def test_the_project_ships_three_queues_highest_priority_first():
    assert settings.RELIABILITY_QUEUES == ("critical", "default", "bulk")
    assert list(settings.RQ_QUEUES) == list(settings.RELIABILITY_QUEUES)
    # One Redis for all: a worker's queues must share its connection (django-rq checks it).
    connections = [{k: v for k, v in queue.items() if k != "DEFAULT_TIMEOUT"} for queue in settings.RQ_QUEUES.values()]
    assert all(connection == connections[0] for connection in connections)


def test_a_pipeline_runs_on_the_queue_it_names_or_on_default():
    assert Pipeline("q_named", queue="bulk", register=False).queue == "bulk"
    assert Pipeline("q_unnamed", register=False).queue == "default"


def test_a_queue_that_is_not_configured_is_refused_at_declaration_naming_pipeline_and_queue():
    with pytest.raises(ConfigurationError, match=r"pipeline 'q_typo': queue 'bluk' is not one of the configured"):
        Pipeline("q_typo", queue="bluk", register=False)


def test_worker_processes_listen_to_every_queue_in_priority_order():
    assert WORKER_QUEUES == settings.RELIABILITY_QUEUES
    assert worker_argv()[-4:] == ["--with-scheduler", "critical", "default", "bulk"]


def test_the_queues_above_one_are_those_before_it_in_priority_order():
    assert queues_above("bulk") == ("critical", "default")
    assert queues_above("default") == ("critical",)
    assert queues_above("critical") == ()
    assert queues_above("not_configured") == ()
