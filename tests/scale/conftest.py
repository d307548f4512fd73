"""Scale fixtures: one service made of several api, worker and beat processes on one private
Redis (or a private Redis Cluster or Sentinel group), with Redis or RabbitMQ as the broker
(``scalekit``).

Everything here is private to the test run (its own redis-server, its own vhost, free
ports, tmp dirs), so this folder can run beside the other slow suites: `-m scale`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from scalekit import (
    BROKERS,
    Cluster,
    Service,
    broker_for,
    make_cluster,
    redis_cluster,
    redis_sentinel_group,
)

from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.webhook_receiver import WebhookReceiver


def pytest_configure(config: pytest.Config) -> None:
    """The folder's marker (it runs with every other layer; `-m scale` picks it alone)."""
    config.addinivalue_line(
        "markers", "scale: several api, worker and beat processes as one service"
    )


@pytest.fixture(scope="module", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """Each test of the module once per broker: Redis, then RabbitMQ (a vhost of its own)."""
    with broker_for(request.param) as url:
        yield url


@pytest.fixture(scope="module")
def module_webhook() -> Iterator[WebhookReceiver]:
    """A webhook receiver shared by a module's tests (the chat channel `relay`)."""
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def state(request: pytest.FixtureRequest) -> str:
    """Where the service keeps its state: the private Redis (``redis``, unless a module
    parametrizes it), a private 3-primary Redis Cluster (``redis-cluster``) or a private
    Sentinel group of a primary, one replica and three sentinels (``redis-sentinel``,
    through its ``redis+sentinel://`` URL); with either group the broker stays on the
    private Redis, or RabbitMQ."""
    return str(getattr(request, "param", "redis"))


@pytest.fixture(scope="module")
def service(
    broker: str | None,
    state: str,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    module_webhook: WebhookReceiver,
) -> Iterator[Service]:
    """Two apis, two workers (2 runs in flight each, so a burst spreads over both) and two
    beats on database 1 of the private Redis (or, with ``state`` ``redis-cluster`` or
    ``redis-sentinel``, on a private Redis Cluster or Sentinel group with database 1 as the
    broker), kept for the module's tests; flushed after."""
    import redis

    url = redis_server.url.rsplit("/", 1)[0] + "/1"
    with redis.Redis.from_url(url) as admin, contextlib.ExitStack() as stack:
        assert admin.dbsize() == 0, f"{url} is not empty"
        state_url, broker_url = url, broker
        if state == "redis-cluster":
            group = stack.enter_context(redis_cluster(tmp_path_factory.mktemp("cluster")))
            state_url, broker_url = group.url, broker or url
        elif state == "redis-sentinel":
            sentinel = stack.enter_context(
                redis_sentinel_group(tmp_path_factory.mktemp("sentinel"))
            )
            state_url, broker_url = sentinel.url, broker or url
        cluster = make_cluster(
            state_url, tmp_path_factory.mktemp("service"), module_webhook.url, broker_url
        )
        made = None
        try:
            made = Service(cluster)
            if broker:  # the workers consume from RabbitMQ, not from the Redis
                assert all("Connected to amqp://" in w.output() for w in made.workers)
            yield made
        finally:
            if made is not None:
                made.close()
            cluster.stop_all()
            admin.flushdb()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the processes' logs to a failed test of this folder."""
    report = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        found = funcargs.get("service")
        cluster = found.cluster if isinstance(found, Service) else funcargs.get("cluster")
        if isinstance(cluster, Cluster):
            report.sections.append(("process logs", cluster.logs()))
    return report
