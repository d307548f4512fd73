"""The oldest Redis the store runs on (6.2: its scripts use ZADD with LT): a process
started on an older one stops at once, naming what it found, before it serves anything."""

from __future__ import annotations

import pytest

from switchboard.shared.config import ConfigError, Settings
from switchboard.shared.store import Store
from switchboard.shared.store.stats import ServerStats, parse_version, too_old
from switchboard.wiring import check_layout

pytestmark = pytest.mark.integration


def test_the_servers_the_tests_run_on_are_new_enough(redis_url: str, settings: Settings) -> None:
    store = Store.from_url(redis_url)
    try:
        version = store.stats.version()
    finally:
        store.close()
    assert not too_old(version), version
    check_layout(settings)  # starts: nothing raised


def test_a_process_on_a_redis_older_than_6_2_stops_naming_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server says it is 6.0.16 (as Ubuntu 22.04's does): the start check refuses it."""
    monkeypatch.setattr(ServerStats, "version", lambda _self: "6.0.16")
    with pytest.raises(ConfigError) as raised:
        check_layout(settings)
    assert str(raised.value).startswith(
        "the Redis at SWITCHBOARD_REDIS_URL is 6.0.16: Switchboard needs Redis 6.2 or newer"
    ), raised.value


@pytest.mark.parametrize(
    ("version", "old"),
    [
        ("5.0.7", True),
        ("6.0.16", True),
        ("6.2.0", False),
        ("6.2.912183", False),
        ("7.0.15", False),
        ("8.0.2", False),
        ("", False),
        ("unknown", False),
    ],
)
def test_which_versions_are_too_old(version: str, old: bool) -> None:
    """Below 6.2 is refused; a version that cannot be read is left to the server to fail."""
    assert too_old(version) is old
    assert parse_version(f"Redis server v={version} sha=0") == parse_version(version)
