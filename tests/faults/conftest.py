"""Fault fixtures: a cluster of product processes on a private Redis, and a loopback
webhook receiver standing in for the chat platform (see ``faultkit``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultkit import Cluster, base_config, merged

from switchboard_testkit.webhook_receiver import WebhookReceiver


@pytest.fixture
def extra_config() -> dict[str, Any]:
    """Per-test config laid over the base (override with parametrize or in a module)."""
    return {}


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    webhook: WebhookReceiver,
    extra_config: dict[str, Any],
) -> Iterator[Callable[[str], Cluster]]:
    """Build clusters on a Redis URL; every process is killed at teardown, logs shown on
    failure."""
    made: list[Cluster] = []
    request.node.fault_clusters = made

    def make(redis_url: str) -> Cluster:
        cluster = Cluster(redis_url, tmp_path, merged(base_config(webhook.url), extra_config))
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()


@pytest.fixture
def cluster(make_cluster: Callable[[str], Cluster], redis_url: str) -> Iterator[Cluster]:
    """A cluster on the session's private Redis (an empty database); its processes are
    killed before that database is flushed for the next test."""
    made = make_cluster(redis_url)
    yield made
    made.stop_all()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the process logs to a failed fault test."""
    report = yield
    if report.failed and call.when == "call":
        for found in getattr(item, "fault_clusters", []):
            report.sections.append(("process logs", found.logs()))
    return report
