"""The anchor for queue figures: a plain Celery app with one no-op task and a result backend.

Benchmarks compare the product against `noop.delay().get()` (and no-op tasks completed per
second) on the same Redis, measured in the same run, so ratios hold on a noisy machine.
The anchor worker runs this module: `celery -A switchboard.bench.anchor worker -Q anchor`.
"""

from __future__ import annotations

import os

from celery import Celery

QUEUE = "anchor"
NOOP = "anchor.noop"


def create_app(redis_url: str) -> Celery:
    """A Celery app with Celery's defaults, the no-op task, and Redis as broker and backend."""
    app = Celery("anchor", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name=NOOP, shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        """Do nothing (the anchor task)."""

    return app


app = create_app(os.environ.get("SWITCHBOARD_REDIS_URL", "redis://127.0.0.1:6379/0"))
