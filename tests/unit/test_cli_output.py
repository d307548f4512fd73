"""The CLI's own output: the channel column, exit codes of domain errors, escaped messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer

from switchboard.cli import client, common
from switchboard.shared.config import Settings
from switchboard.shared.errors import Conflict, InvalidInput, NotFound, StoreUnavailable
from switchboard.supervisor.runfile import StackInfo, write_stack

pytestmark = pytest.mark.unit


def test_channel_column_prefers_the_delivery_route() -> None:
    """The column shows deliveryContext's channel, else lastChannel, else the key's channel."""
    row = {"channel": "unknown", "lastChannel": "slack", "deliveryContext": {"channel": "discord"}}
    assert client._delivery_channel(row) == "discord"
    assert client._delivery_channel({"channel": "unknown", "lastChannel": "slack"}) == "slack"
    assert client._delivery_channel({"channel": "telegram"}) == "telegram"
    assert client._delivery_channel({"channel": "unknown"}) == "-"


def test_domain_errors_map_to_documented_exit_codes() -> None:
    """Bad input exits 2, unavailable 3, not found and refusals 1."""
    assert common._exit_code(InvalidInput("bad")) == common.EXIT_USAGE
    assert common._exit_code(StoreUnavailable("down")) == common.EXIT_UNAVAILABLE
    assert common._exit_code(NotFound("gone")) == common.EXIT_REFUSED
    assert common._exit_code(Conflict("busy")) == common.EXIT_REFUSED


def test_failure_lines_keep_square_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    """A detail like a session key or JSON prints verbatim, not read as rich markup."""
    with pytest.raises(typer.Exit) as exited:
        common._fail(
            "not found", 'no session agent:main:[x] {"a": [1]} [bold]', common.EXIT_REFUSED
        )
    assert exited.value.exit_code == 1
    assert 'no session agent:main:[x] {"a": [1]} [bold]' in capsys.readouterr().err


def test_wide_table_shows_whole_keys_and_every_column_past_the_edge() -> None:
    """With --wide (and into a pipe) every cell is whole, on a screen narrower than the
    table too: the line passes the edge, no column is squeezed away."""
    from rich.console import Console

    key = "agent:main:subagent:0b7e3c1e-7d0f-4b43-9a4e-1f6f0a1b2c3d"
    row = {"key": key, "kind": "other", "channel": "internal", "updatedAt": 0, "model": "m"}
    out = Console(width=60, record=True, highlight=False, soft_wrap=True)
    out.print(client._sessions_table([row], wide=True, width=60))
    body = [line for line in out.export_text().splitlines() if line.startswith("│")]
    assert len(body) == 1 and len(body[0]) > 60, body
    cells = [cell.strip() for cell in body[0].strip("│").split("│")]
    assert cells[:3] == [key, "other", "internal"], cells


def test_a_running_stack_fills_in_only_what_no_setting_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's Redis and api are used unless SWITCHBOARD_REDIS_URL / HOST / PORT / --url say."""
    for name in ("REDIS_URL", "BROKER_URL", "HOST", "PORT"):
        monkeypatch.delenv(f"SWITCHBOARD_{name}", raising=False)
    write_stack(
        tmp_path, StackInfo(os.getpid(), "http://127.0.0.1:9999", "redis://h:1/0", "redis://b:2/0")
    )
    bare = Settings(data_dir=tmp_path)
    found = common._with_stack_redis(bare)
    assert (found.redis_url, found.broker_url) == ("redis://h:1/0", "redis://b:2/0")
    assert common._api_base(bare, None) == "http://127.0.0.1:9999"
    configured = Settings(data_dir=tmp_path, redis_url="redis://mine:3/0", port=8000)
    assert common._with_stack_redis(configured).redis_url == "redis://mine:3/0"
    assert common._api_base(configured, None) == "http://127.0.0.1:8000"
    assert common._api_base(bare, "http://elsewhere:1/") == "http://elsewhere:1"


def test_bench_failures_keep_square_brackets() -> None:
    """A scenario's error quoting `[...]` prints whole, on its line and in the table."""
    from rich.console import Console

    import switchboard_bench as bench

    out = Console(width=200, record=True, highlight=False)
    out.print(bench._failed_line("latency", "run [boom] broke"))
    out.print(bench._table([], {"latency": "run [boom] broke"}, quick=True))
    text = out.export_text()
    assert "latency failed: run [boom] broke" in text
    assert "ERROR: run [boom] broke" in text


def test_a_narrow_table_keeps_one_line_a_session_and_the_short_columns_whole() -> None:
    """On a terminal narrower than the keys, each session is one line: kind, channel, time,
    tokens and status whole, the key cut in its middle (its end kept), the model at its end."""
    from rich.console import Console

    key = "agent:main:subagent:0b7e3c1e-7d0f-4b43-9a4e-1f6f0a1b2c3d"
    row = {
        "key": key,
        "kind": "other",
        "channel": "internal",
        "updatedAt": 1795594634240,
        "model": "openai/gpt-4o-mini",
        "totalTokens": 12345,
        "status": "running",
    }
    out = Console(width=100, record=True, highlight=False)
    out.print(client._sessions_table([row], wide=False, width=100))
    body = [line for line in out.export_text().splitlines() if line.startswith("│")]
    assert len(body) == 1, body
    for cell in ("other", "internal", "2026-11-25 08:17:14", "12345", "running"):
        assert cell in body[0], (cell, body[0])
    assert key not in body[0] and "…" in body[0]
    cut = body[0].split("│")[1].strip()  # the key cell: its start and its distinctive end
    start, end = cut.split("…")
    assert key.startswith(start) and key.endswith(end) and len(end) > len(start) > 0
    assert end.endswith("1f6f0a1b2c3d")


@pytest.mark.parametrize("width", [4, 9, 10, 30])
def test_a_cut_key_keeps_its_start_and_its_end(width: int) -> None:
    """A key cut to a width is that wide, with `…` in its middle and more of its end."""
    key = "agent:main:discord:group:ops-room-42"
    cut = client._middle_cut(key, width)
    assert len(cut) == width
    start, end = cut.split("…")
    assert key.startswith(start) and key.endswith(end) and len(end) >= len(start)
