"""The example in examples/: `switchboard up` with its config, then its walkthrough, end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import json5
import pytest

from switchboard_testkit.up import clean_env, free_port, start_up

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int, Path]]:
    """`switchboard up` with the example config (webhook moved to a free port) in a temp dir."""
    hook_port = free_port()
    config = json5.loads((EXAMPLES / "switchboard.json5").read_text())
    config["channels"]["discord"]["webhook"]["url"] = f"http://127.0.0.1:{hook_port}/hook"
    with start_up(tmp_path_factory.mktemp("example"), config) as started:
        yield started.url, started.token, hook_port, started.workdir


def test_walkthrough_runs_every_step(up: tuple[str, str, int, Path]) -> None:
    """The walkthrough lists, reads, sends with reply-back and announce, and fans out."""
    url, token, hook_port, workdir = up
    env = {
        **clean_env(),
        "SWITCHBOARD_URL": url,
        "SWITCHBOARD_TOKEN": token,
        "WEBHOOK_PORT": str(hook_port),
        "WALKTHROUGH_TIMEOUT": "60",
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "walkthrough.py")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "agent:main:discord:group:ops │ group" in out
    assert "sessions_list: 2 sessions visible" in out
    assert "sessions_history: 2 messages of agent:main:discord:group:ops" in out
    assert "sessions_send: status ok" in out
    assert re.search(r"│ 1\s+│ requester │ agent:main:main\s+│ ok", out)
    assert re.search(r"│ 2\s+│ target\s+│ agent:main:discord:group:ops │ ok", out)
    assert "reply-back: 2 rounds after the primary run (stop: max_turns)" in out
    assert out.count("webhook received") == 1
    assert "announce delivered: 1 webhook request(s)" in out
    for task in ("research A", "research B", "research C"):
        assert f'announce A subagent task "{task}" just completed' in out
    assert "sub-agent announces: 3 in main's transcript" in out
    assert "walkthrough complete" in out
