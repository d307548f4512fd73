"""The FastAPI gateway: `/healthz`, `/rpc`, `/tools/invoke`. Stateless; run as many as you like."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from switchboard import __version__, telemetry
from switchboard.api import (
    batches,
    files,
    metrics,
    openai_compat,
    responses,
    rpc,
    tools,
    transcripts,
)
from switchboard.api.a2a import mount_a2a
from switchboard.api.auth import install_auth
from switchboard.api.console import install_console
from switchboard.api.errors import install_error_handlers
from switchboard.api.heartbeat import api_heartbeat
from switchboard.api.limits import BodySizeLimit, JsonDepthLimit
from switchboard.api.mcp import mount_mcp, serving_mcp
from switchboard.shared import gc_tune
from switchboard.shared.config import Settings, SwitchboardConfig, get_config, get_settings
from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.shared.store.aio import AsyncStore

log = logging.getLogger("switchboard.api")


def resolve_token(settings: Settings, config: SwitchboardConfig) -> str:
    """The bearer token: SWITCHBOARD_TOKEN, else gateway.auth.token."""
    token = settings.token or config.gateway.auth.token
    if not token:
        raise Unavailable(
            "no api token: set SWITCHBOARD_TOKEN or gateway.auth.token "
            "(`switchboard up` generates one)"
        )
    return token


def create_app(
    settings: Settings | None = None,
    config: SwitchboardConfig | None = None,
    services: Services | None = None,
    *,
    tune_gc: bool = False,
    url: str | None = None,
) -> FastAPI:
    """Build the api; services are wired at startup unless given (tests).

    ``tune_gc``: the process serves this app for its lifetime (`switchboard api`): once
    started, the garbage collector is set for it (`gc_tune.tune_gc`). Freezing what the
    startup built (services, the Celery app, connections) matters: a freeze before it
    left an api answering sends at 2.9-3.3 ms of CPU each, against 2.4-2.8 ms.

    ``url``: where the api listens (`switchboard api`): the app then writes its heartbeat
    (`sb:apis`, listed by `check-health --all`) while it serves; None (an app built inside
    tests or another program) writes none."""
    settings = settings or get_settings()
    config = config or get_config(settings.config)
    token = resolve_token(settings, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or _build_services(settings, config)
        app.state.services = svc
        async_store = AsyncStore.from_url(
            settings.redis_url or "", svc.store.ks, socket_keepalive=True, health_check_interval=25
        )
        app.state.waiter = async_store.run_waiter()
        await app.state.waiter.start()

        # Run reads on the event loop (the waiter's async client), not in a thread.
        app.state.fetch_run = app.state.waiter.fetch
        if tune_gc:
            gc_tune.tune_gc()
        try:
            async with contextlib.AsyncExitStack() as serving:
                await serving.enter_async_context(serving_mcp(app))
                if url is not None:
                    await serving.enter_async_context(api_heartbeat(svc.store, url))
                yield
        finally:
            await app.state.waiter.stop()
            await async_store.aclose()

    app = FastAPI(
        title="Switchboard",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.token = token
    telemetry.instrument_api(app)  # only with an OTLP endpoint set
    app.add_middleware(JsonDepthLimit)  # inside the size limit: reads at most 2 MB
    app.add_middleware(BodySizeLimit)
    install_auth(app, settings, token)  # outermost: every route but /healthz needs the token
    install_error_handlers(app)
    app.include_router(rpc.router)
    app.include_router(tools.router)
    app.include_router(metrics.router)
    app.include_router(openai_compat.router)
    app.include_router(responses.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(transcripts.router)
    mount_mcp(app)
    mount_a2a(app, config)  # /a2a/<agentId>, the agent cards
    install_console(app)  # after install_auth: /console, /events

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        """Liveness and Redis reachability; no auth."""
        svc: Services = request.app.state.services
        await run_in_threadpool(svc.store.ping)
        return {"ok": True, "version": __version__}

    return app


def _build_services(settings: Settings, config: SwitchboardConfig) -> Services:
    from switchboard.wiring import build_services
    from switchboard.workers.app import create_celery_app
    from switchboard.workers.queue import CeleryQueue

    return build_services(settings, queue=CeleryQueue(create_celery_app(settings)), config=config)
