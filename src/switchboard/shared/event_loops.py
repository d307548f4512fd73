"""Which event loop and HTTP parser the product's servers and run loops use.

The api serves on uvloop with the httptools parser, and a worker's run loop is a uvloop
loop: libuv's loop and a C HTTP parser take less CPU per request than asyncio's loop in
Python and h11's parser in Python (fire-and-forget sends took 8% less CPU per run across
api, worker and Redis with them, `switchboard bench -s throughput`). Where uvloop cannot
be had (it is not built for Windows), the process uses asyncio's own loop and uvicorn's
h11 parser.
"""

from __future__ import annotations

import asyncio
import importlib.util
from functools import cache
from typing import Literal, TypedDict


class UvicornLoop(TypedDict):
    """The ``loop`` and ``http`` options handed to uvicorn."""

    loop: Literal["uvloop", "asyncio"]
    http: Literal["httptools", "h11"]


@cache
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def uvicorn_loop() -> UvicornLoop:
    """uvicorn's loop and parser: uvloop and httptools where they are installed, else
    asyncio and h11."""
    return {
        "loop": "uvloop" if _installed("uvloop") else "asyncio",
        "http": "httptools" if _installed("httptools") else "h11",
    }


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop for a worker's runs: uvloop's where it is installed, else asyncio's."""
    if _installed("uvloop"):
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
