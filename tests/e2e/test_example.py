"""The example in examples/: `switchboard up` with its config, then its walkthrough, end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import json5
import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int, Path]]:
    """`switchboard up` with the example config (webhook moved to a free port) in a temp dir."""
    workdir = tmp_path_factory.mktemp("example")
    hook_port, api_port = _free_port(), _free_port()
    config = json5.loads((EXAMPLES / "switchboard.json5").read_text())
    config["channels"]["discord"]["webhook"]["url"] = f"http://127.0.0.1:{hook_port}/hook"
    (workdir / "switchboard.json5").write_text(json.dumps(config))
    command = [sys.executable, "-m", "switchboard", "up", "--config", "switchboard.json5"]
    proc = subprocess.Popen(
        [*command, "--port", str(api_port)],
        cwd=workdir,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    token = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not token:
        line = proc.stdout.readline()
        lines.append(line)
        if match := re.match(r"token (\S+)", line.strip()):
            token = match.group(1)
        assert proc.poll() is None, "".join(lines)
    assert token, "up never printed a token:\n" + "".join(lines)
    threading.Thread(target=lambda: [lines.append(x) for x in proc.stdout], daemon=True).start()
    url = f"http://127.0.0.1:{api_port}"
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield url, token, hook_port, workdir
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_walkthrough_runs_every_step(up: tuple[str, str, int, Path]) -> None:
    """The walkthrough lists, reads, sends with reply-back and announce, and fans out."""
    url, token, hook_port, workdir = up
    env = {
        **_clean_env(),
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
