"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest
import redis

from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.webhook_receiver import WebhookReceiver

# --- the run's switches ---------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--slot-groups=N``: the run's SWITCHBOARD_SLOT_GROUPS (default: the environment's)."""
    parser.addoption(
        "--slot-groups",
        type=int,
        default=None,
        help="set SWITCHBOARD_SLOT_GROUPS for the tests and every process they start",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Put the chosen switches in the environment: every `Settings` built by a test, and the
    processes tests start (workers, the api, the CLI), read them from there."""
    groups = config.getoption("--slot-groups")
    if groups is not None:
        os.environ["SWITCHBOARD_SLOT_GROUPS"] = str(groups)
    # A script or transaction whose keys span hash slots fails every test that makes one,
    # on any Redis, as it would on a Redis Cluster.
    os.environ.setdefault("SWITCHBOARD_SLOT_CHECK", "on")
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI job's timeout, a ``kill``) ends the run as Ctrl-C does: the fixtures'
    teardown and atexit then stop the private servers and processes the tests started,
    which the default action (dying at once) would leave running."""
    raise KeyboardInterrupt


# --- Redis: a private server per session, never a developer's data -------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free port, without persistence, for the whole session."""
    with RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The URL of an empty database on the private server, flushed after the test."""
    with redis.Redis.from_url(redis_server.url) as admin:
        keys = admin.dbsize()
        if keys:
            reason = f"refusing {redis_server.url}: it holds {keys} keys, tests need it empty"
            pytest.fail(reason, pytrace=False)
        yield redis_server.url
        # Reconnects if the test restarted the server; safe, the server is ours alone.
        admin.flushdb()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client (bytes responses) for the empty database of `redis_url`."""
    with redis.Redis.from_url(redis_url, decode_responses=False) as client:
        yield client


# --- a chat platform ------------------------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """A loopback webhook receiver recording every POST (a test's channel points at it)."""
    with WebhookReceiver() as receiver:
        yield receiver
