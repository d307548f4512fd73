"""uvloop and httptools: in a real `switchboard api` and `switchboard worker` serving a real
run, and in a worker's run loops."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from switchboard.shared.config import Settings
from switchboard.shared.event_loops import uvicorn_loop
from switchboard.workers.app import create_celery_app
from switchboard.workers.run_host import RunHost, run_host
from switchboard_testkit.procs import send_and_wait

pytestmark = pytest.mark.integration


def _mapped(pid: int) -> str:
    """The paths of the shared objects a process has loaded."""
    return Path(f"/proc/{pid}/maps").read_text()


def test_api_and_worker_processes_serve_a_run_on_uvloop(switchboard_procs: Any) -> None:
    """A send waits for its run through a real api and worker; the api runs on uvloop with
    httptools and the worker's runs on uvloop."""
    with switchboard_procs.serving(beat=False) as (url, [api, worker]):
        result = send_and_wait(url, "agent:main:loops", "hello")
        assert result["status"] == "ok" and "hello" in result["reply"], result
        api_maps, worker_maps = _mapped(api.pid), _mapped(worker.pid)
    assert "/uvloop/" in api_maps
    assert "/httptools/" in api_maps
    assert "/uvloop/" in worker_maps


def test_a_workers_run_loops_are_uvloop(redis_url: str) -> None:
    """A worker's run loop, made from the app's settings, is a uvloop loop."""
    settings = Settings(redis_url=redis_url)
    app: Celery = create_celery_app(settings)  # its tasks and `RunHost` made from settings
    host = run_host(app)
    assert isinstance(host, RunHost)

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    try:
        made_by = host.submit(loop_module()).result(timeout=10)
    finally:
        host.loops.close()
    assert made_by.startswith("uvloop")


def test_uvicorn_is_told_its_loop_and_parser() -> None:
    """uvloop and httptools, where installed (they are here), named to uvicorn."""
    assert uvicorn_loop() == {"loop": "uvloop", "http": "httptools"}
