"""uvloop and httptools with the fast paths on, asyncio and h11 with them off: in a real
`switchboard api` and `switchboard worker` serving a real run, and in a worker's run loops."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from switchboard.shared.config import Settings
from switchboard.shared.event_loops import uvicorn_loop
from switchboard.workers.app import create_celery_app
from switchboard.workers.tasks import RunHost, run_host
from switchboard_testkit.procs import send_and_wait

pytestmark = pytest.mark.integration

MODES = [pytest.param(True, id="fast-paths"), pytest.param(False, id="plain")]


def _mapped(pid: int) -> str:
    """The paths of the shared objects a process has loaded."""
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("fast_paths", MODES)
def test_api_and_worker_processes_serve_a_run_on_the_loop_the_setting_names(
    fast_paths: bool, switchboard_procs: Any
) -> None:
    """A send waits for its run through a real api and worker; the api runs on uvloop with
    httptools and the worker's runs on uvloop exactly when the fast paths are on."""
    switchboard_procs.env["SWITCHBOARD_FAST_PATHS"] = "true" if fast_paths else "false"
    with switchboard_procs.serving(beat=False) as (url, [api, worker]):
        result = send_and_wait(url, "agent:main:loops", "hello")
        assert result["status"] == "ok" and "hello" in result["reply"], result
        api_maps, worker_maps = _mapped(api.pid), _mapped(worker.pid)
    assert ("/uvloop/" in api_maps) is fast_paths
    assert ("/httptools/" in api_maps) is fast_paths
    assert ("/uvloop/" in worker_maps) is fast_paths


@pytest.mark.parametrize("fast_paths", MODES)
def test_a_workers_run_loops_are_uvloop_only_with_the_fast_paths_on(
    fast_paths: bool, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url, fast_paths=fast_paths)
    app: Celery = create_celery_app(settings)  # its tasks and `RunHost` made from settings
    host = run_host(app)
    assert isinstance(host, RunHost)

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    try:
        made_by = host.submit(loop_module()).result(timeout=10)
    finally:
        host.loops.close()
    assert made_by.startswith("uvloop") is fast_paths
    assert made_by.startswith("asyncio") is not fast_paths


def test_uvicorn_is_told_its_loop_and_parser_in_both_modes() -> None:
    """Explicit both ways: uvicorn's default ("auto") would take uvloop with them off too."""
    assert uvicorn_loop(Settings(fast_paths=True)) == {"loop": "uvloop", "http": "httptools"}
    assert uvicorn_loop(Settings(fast_paths=False)) == {"loop": "asyncio", "http": "h11"}
