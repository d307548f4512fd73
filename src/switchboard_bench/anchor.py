"""The anchors for queue figures: a plain Celery app with one no-op task and a result backend.

Benchmarks compare the product against `noop.delay().get()` (and no-op tasks completed per
second) on the same redis-server, measured in the same run, so ratios hold on a noisy
machine. The app is Celery at its defaults: only the broker and result backend URLs are
set. Two anchor workers run it side by side, each as its own deployment on its own Redis
database (its own default queue, so the client calls plain `.delay()`): Celery as a plain
user gets it (`celery -A switchboard_bench.anchor worker`: the prefork pool, one process per
core) and Celery in the product's own pool shape (`-P threads -c 64`); each target is
judged against the faster of the two. A worker finds its database in ``ANCHOR_URL``, and
its broker there too unless ``ANCHOR_BROKER_URL`` names another (RabbitMQ, for the anchor
on the broker the product runs on in the `scale` scenario).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from celery import Celery

NOOP = "anchor.noop"
URL_ENV = "ANCHOR_URL"
BROKER_ENV = "ANCHOR_BROKER_URL"


@dataclass(frozen=True)
class AnchorShape:
    """One anchor worker: its name, Redis database and the pool options it starts with."""

    name: str
    db: int
    pool_argv: tuple[str, ...]
    what: str

    @property
    def process(self) -> str:
        """The name of its process in a bench stack."""
        return f"anchor-{self.name}"

    def url(self, redis_url: str) -> str:
        """Its broker and backend URL: ``redis_url`` on this anchor's own database."""
        return urlunsplit(urlsplit(redis_url)._replace(path=f"/{self.db}"))


def shapes(threads: int) -> tuple[AnchorShape, AnchorShape]:
    """Celery's defaults (prefork, concurrency = cores) and the product's pool shape."""
    # Databases 1 and 2: the product keeps database 0, and the anchors never share a queue.
    return (
        AnchorShape("prefork", 1, (), "Celery's defaults: prefork pool, one process per core"),
        AnchorShape(
            "threads",
            2,
            ("-P", "threads", "-c", str(threads)),
            f"the product worker's pool shape: threads, concurrency {threads}",
        ),
    )


def create_app(url: str, broker: str | None = None) -> Celery:
    """A Celery app at Celery's defaults, with Redis at ``url`` as result backend and as
    broker (unless ``broker`` names another)."""
    # Not set as the current app: the bench process also holds the product's Celery app.
    app = Celery("anchor", broker=broker or url, backend=url, set_as_current=False)

    @app.task(name=NOOP, shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        """Do nothing (the anchor task)."""

    return app


app = create_app(
    os.environ.get(URL_ENV, "redis://127.0.0.1:6379/1"), os.environ.get(BROKER_ENV) or None
)
