"""The worker's pool starts all of its threads up front."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from switchboard.workers.pool import TaskPool, prestart

pytestmark = pytest.mark.unit


def test_prestart_starts_every_thread_and_leaves_them_idle() -> None:
    executor = ThreadPoolExecutor(max_workers=24)
    try:
        assert prestart(executor, 24, timeout_s=10) == 24
        # All idle: jobs now run on the started threads, no new thread is made.
        names = {
            executor.submit(lambda: threading.current_thread().name).result() for _ in range(50)
        }
        assert len(executor._threads) == 24
        assert names <= {t.name for t in executor._threads}
    finally:
        executor.shutdown()


def test_the_pool_starts_its_threads_when_it_starts() -> None:
    pool = TaskPool(limit=8)
    pool.start()
    try:
        assert pool._get_info()["threads"] == 8
    finally:
        pool.stop()
