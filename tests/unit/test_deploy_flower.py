"""`switchboard flower` with an empty password, through the real CLI process: one clear
line on stderr and exit 2 at once (a supervisor restarting it would otherwise loop)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PASSWORD = "s3cret-never-echoed"


def flower(
    tmp_path: Path, *args: str, auth: str | None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `python -m switchboard flower <args>` with the auth env var; (result, seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_DATA_DIR"] = str(tmp_path)
    env["SWITCHBOARD_REDIS_URL"] = "redis://127.0.0.1:1/0"  # never reached: refused before
    if auth is not None:
        env["SWITCHBOARD_FLOWER_BASIC_AUTH"] = auth
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "switchboard", "flower", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, time.monotonic() - started


@pytest.mark.parametrize(
    ("args", "auth", "says"),
    [
        ((), "admin:", "(user 'admin') has an empty password"),
        (("--basic-auth", "admin:"), None, "(user 'admin') has an empty password"),
        ((), f"ops:{PASSWORD},admin:", "pair 2 of"),
        ((), f":{PASSWORD}", "has an empty user name"),
        ((), "", "without authentication"),
    ],
)
def test_flower_with_an_empty_password_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], auth: str | None, says: str
) -> None:
    """An empty password (env or option), user, or no auth at all: exit 2, one stderr line."""
    result, took_s = flower(tmp_path, *args, auth=auth)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert lines[0].startswith("refusing to start Flower")
    assert PASSWORD not in result.stderr
    assert result.stdout == ""
    assert took_s < 30  # refused at once, not after retrying a broker
