"""Which event loop and HTTP parser the product's servers and run loops use.

With the fast paths on (``Settings.fast_paths``), the api serves on uvloop with the
httptools parser, and a worker's run loops are uvloop loops: libuv's loop and a C HTTP
parser take less CPU per request than asyncio's loop in Python and h11's parser in Python.
Fire-and-forget sends took 8% less CPU per run across api, worker and Redis with them
(3.72 against 4.05 ms, `switchboard bench -s throughput`, docs/performance.md).

Off, or where uvloop cannot be had (it is not built for Windows), every process uses
asyncio's own loop and uvicorn's h11 parser: the plain path, the same on every platform.
"""

from __future__ import annotations

import asyncio
import importlib.util
from functools import cache
from typing import Literal, TypedDict

from switchboard.shared.config import Settings


class UvicornLoop(TypedDict):
    """The ``loop`` and ``http`` options handed to uvicorn."""

    loop: Literal["uvloop", "asyncio"]
    http: Literal["httptools", "h11"]


@cache
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def uses_uvloop(settings: Settings) -> bool:
    """Whether the fast paths are on and uvloop is installed."""
    return settings.fast_paths and _installed("uvloop")


def uvicorn_loop(settings: Settings) -> UvicornLoop:
    """uvicorn's loop and parser: uvloop and httptools with the fast paths on (each where
    it is installed), else asyncio and h11. Always explicit: uvicorn's own default, "auto",
    would take uvloop with the fast paths off too."""
    httptools = settings.fast_paths and _installed("httptools")
    return {
        "loop": "uvloop" if uses_uvloop(settings) else "asyncio",
        "http": "httptools" if httptools else "h11",
    }


def new_event_loop(settings: Settings) -> asyncio.AbstractEventLoop:
    """A new loop for a worker's runs: uvloop's with the fast paths on, else asyncio's."""
    if uses_uvloop(settings):
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
