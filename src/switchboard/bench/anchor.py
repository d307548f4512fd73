"""The anchor for latency figures: a plain Celery app with one no-op task and a result backend.

Benchmarks compare the product against `noop.delay().get()` on the same Redis, measured in
the same run, so ratios hold on a noisy machine.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery(
    "anchor",
    broker=os.environ.get("SWITCHBOARD_REDIS_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("SWITCHBOARD_REDIS_URL", "redis://127.0.0.1:6379/0"),
    set_as_current=False,
)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_default_queue="anchor",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="anchor.noop", shared=False)  # type: ignore[untyped-decorator]
def noop() -> None:
    """Do nothing (the anchor task)."""
