"""`Together` gathers what a loop's coroutines ask for in one turn of the loop into one
call off the loop, answers each its own result, and passes a failure to every one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from switchboard.shared.runtime.together import Together

pytestmark = pytest.mark.unit


def test_what_is_asked_in_one_turn_is_done_in_one_call_off_the_loop() -> None:
    calls: list[tuple[list[int], bool]] = []

    def double_all(items: list[int]) -> list[int]:
        calls.append((list(items), threading.current_thread() is threading.main_thread()))
        return [2 * i for i in items]

    together: Together[int, int] = Together(double_all)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(together(i) for i in range(50))))

    assert asyncio.run(main()) == [2 * i for i in range(50)]
    assert calls == [(list(range(50)), False)]  # one call, on a thread that is not the loop's
    assert (together.calls, together.items) == (1, 50)


def test_asked_while_a_call_is_under_way_it_goes_in_the_next_call_without_waiting() -> None:
    started = threading.Event()
    release = threading.Event()
    calls: list[list[str]] = []

    def do_all(items: list[str]) -> list[str]:
        calls.append(list(items))
        if items == ["first"]:
            started.set()
            release.wait(5)
        return [s.upper() for s in items]

    together: Together[str, str] = Together(do_all)

    async def main() -> tuple[str, str, float]:
        first = asyncio.ensure_future(together("first"))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        t0 = time.monotonic()
        second = await together("second")  # done while the first call still waits
        waited = time.monotonic() - t0
        release.set()
        return await first, second, waited

    first, second, waited = asyncio.run(main())
    assert (first, second) == ("FIRST", "SECOND")
    assert calls == [["first"], ["second"]]
    assert waited < 4  # it did not wait for the first call to return


def test_a_failing_call_fails_every_item_it_was_given() -> None:
    def fails(items: list[int]) -> Sequence[int]:
        raise ValueError(f"boom over {len(items)}")

    together: Together[int, int] = Together(fails)

    async def main() -> list[BaseException | int]:
        return list(await asyncio.gather(*(together(i) for i in range(3)), return_exceptions=True))

    outcomes = asyncio.run(main())
    assert [str(o) for o in outcomes] == ["boom over 3"] * 3
    assert all(isinstance(o, ValueError) for o in outcomes)


def test_a_short_answer_is_an_error_not_a_wrong_result() -> None:
    together: Together[int, int] = Together(lambda items: items[:-1])

    async def main() -> list[BaseException | int]:
        return list(await asyncio.gather(together(1), together(2), return_exceptions=True))

    outcomes = asyncio.run(main())
    assert all(isinstance(o, RuntimeError) and "1 results for 2 items" in str(o) for o in outcomes)


def test_a_cancellation_waits_for_the_call_to_return() -> None:
    finished: list[float] = []

    def slow(items: list[int]) -> list[int]:
        time.sleep(0.3)
        finished.append(time.monotonic())
        return items

    together: Together[int, int] = Together(slow)

    async def main() -> float:
        task = asyncio.ensure_future(together(1))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    cancelled_at = asyncio.run(main())
    assert finished and finished[0] <= cancelled_at
