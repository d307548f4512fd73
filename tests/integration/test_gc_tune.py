"""The api process tunes the garbage collector once its startup has built the services."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from switchboard import cli
from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig, reset_caches
from switchboard.shared.gc_tune import GC_THRESHOLDS
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


@pytest.fixture
def gc_restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_a_served_app_freezes_its_startup_and_collects_less_often(
    settings: Settings, config: SwitchboardConfig, services: Services, gc_restored: None
) -> None:
    """`switchboard api` tunes the collector once started; an embedded app leaves it
    alone."""
    gc.unfreeze()
    default = (700, 10, 10)  # Python's; an in-process worker of another test may have tuned it
    gc.set_threshold(*default)
    with TestClient(create_app(settings, config, services=services)):
        assert gc.get_threshold() == default  # an embedded app leaves the process alone
    with TestClient(create_app(settings, config, services=services, tune_gc=True)) as http:
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert http.get("/healthz").status_code == 200


def test_switchboard_api_serves_a_tuned_app(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Any
) -> None:
    """`switchboard api` builds its app with the collector tuned once it has started."""
    # The api refuses to start without a Redis: the test's own (nothing is written to it).
    monkeypatch.setenv("SWITCHBOARD_REDIS_URL", redis_url)
    monkeypatch.setenv("SWITCHBOARD_KEY_PREFIX", "gctune:")
    monkeypatch.setenv("SWITCHBOARD_DATA_DIR", str(tmp_path))
    reset_caches()
    built: list[dict[str, Any]] = []
    served: list[Any] = []

    def fake_create_app(*args: Any, **kwargs: Any) -> str:
        built.append(kwargs)
        return "app"

    monkeypatch.setattr("switchboard.api.app.create_app", fake_create_app)
    monkeypatch.setattr("uvicorn.run", lambda app, **_: served.append(app))
    try:
        result = CliRunner().invoke(cli.app, ["api", "--port", "0"])
    finally:
        monkeypatch.undo()
        reset_caches()
    assert result.exit_code == 0, result.output
    assert [b["tune_gc"] for b in built] == [True] and served == ["app"]


def test_the_worker_tunes_the_collector_once_it_is_ready(
    settings: Settings, gc_restored: None
) -> None:
    """The worker's ready signal tunes the collector: its startup frozen, young
    collections less often."""
    from celery.signals import worker_ready

    from switchboard.workers.app import create_celery_app

    app = create_celery_app(settings)
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        worker_ready.send(sender=type("Consumer", (), {"app": app})())
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        app.close()
