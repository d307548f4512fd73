"""The fault and scale suites' failure messages: a process's ERROR lines are shown however
early it logged them, before the end of its log (`faultkit.Cluster.logs`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import ERROR_LINES_SHOWN, error_lines

pytestmark = pytest.mark.unit


def line(level: str, event: str, **extra: str) -> str:
    return json.dumps({"level": level, "logger": "switchboard.api", "event": event, **extra})


def test_error_lines_are_the_records_at_error_or_above_with_their_tracebacks() -> None:
    log = "\n".join(
        [
            line("info", "started"),
            line("error", "POST /rpc: 500, unhandled error", exception="Traceback ...\nKeyError"),
            "a line that is not JSON: ERROR",
            "{not json either",
            line("warning", "POST /rpc: 503, Redis unavailable"),
            line("critical", "worker lost"),
        ]
        + [line("info", f"filler {i}") for i in range(1000)]
    )
    found = error_lines(log)
    assert [json.loads(f)["event"] for f in found] == [
        "POST /rpc: 500, unhandled error",
        "worker lost",
    ]
    assert "KeyError" in found[0]


def test_error_lines_are_bounded() -> None:
    log = "\n".join(line("error", f"failed {i}", exception="x" * 20_000) for i in range(50))
    found = error_lines(log)
    assert len(found) == ERROR_LINES_SHOWN
    assert found[0].startswith("{") and "failed 0" in found[0]
    assert all(len(f) < 20_000 for f in found)
