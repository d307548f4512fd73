"""`off_loop` runs blocking work on the loop's executor, in the caller's context, and a
cancellation lets it finish before it goes on."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from switchboard.shared.runtime.off_loop import off_loop

pytestmark = pytest.mark.unit

_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_the_call_runs_off_the_loop_thread_in_the_callers_context() -> None:
    async def main() -> tuple[str, str, int]:
        _who.set("run-1")
        loop_thread = threading.get_ident()
        return await off_loop(
            lambda: (_who.get(), "other" if threading.get_ident() != loop_thread else "loop", 7)
        )

    assert asyncio.run(main()) == ("run-1", "other", 7)


def test_an_error_reaches_the_caller() -> None:
    def fails() -> None:
        raise ValueError("boom")

    async def main() -> None:
        await off_loop(fails)

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())


def test_a_cancellation_waits_for_the_call_to_return() -> None:
    finished: list[float] = []

    def slow() -> None:
        time.sleep(0.3)
        finished.append(time.monotonic())

    async def main() -> float:
        task = asyncio.create_task(off_loop(slow))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    cancelled_at = asyncio.run(main())
    assert finished and finished[0] <= cancelled_at  # returned before the cancellation went on
