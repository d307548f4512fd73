"""A script the server refuses as unknown even after redis-py loaded it again (a failover
between the load and the call) is the store's `StoreUnavailable`, as every Redis failure is,
for the sync scripts and the api's run read alike: the api answers 503, not 500."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import NoScriptError

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScript, load
from switchboard.shared.store.waiter import RunWaiter

pytestmark = pytest.mark.unit


class _Refusing:
    """A registered script whose every call answers NOSCRIPT (sync or async)."""

    def __init__(self, asynchronous: bool = False) -> None:
        self.calls = 0
        self.asynchronous = asynchronous

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.asynchronous:
            return self._refuse()
        raise NoScriptError("No matching script. Please use EVAL.")

    async def _refuse(self) -> Any:
        raise NoScriptError("No matching script. Please use EVAL.")


class _Client:
    """An async client whose scripts are all refused."""

    def __init__(self) -> None:
        self.script = _Refusing(asynchronous=True)

    def register_script(self, source: str) -> _Refusing:
        return self.script


def test_a_sync_script_refused_after_its_reload_is_store_unavailable() -> None:
    """`LuaScript` raises StoreUnavailable (from the NoScriptError) for a refused call."""
    refusing = _Refusing()
    script = LuaScript(load("watch_run"), refusing)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable) as raised:
        script(run="sb:r:x")
    assert isinstance(raised.value.__cause__, NoScriptError) and refusing.calls == 1


def test_the_api_run_read_refused_after_its_reload_is_store_unavailable() -> None:
    """`RunWaiter.fetch` (agent.wait, a waiting send) raises StoreUnavailable, not the
    redis-py error an api would answer 500 for."""
    client = _Client()
    waiter = RunWaiter(client, Keyspace())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        asyncio.run(waiter.fetch("run-1"))
    assert client.script.calls == 1
