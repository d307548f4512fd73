"""`switchboard batch`: the command run as a process against the real api and a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from switchboard.shared.config import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def config_data() -> dict[str, Any]:
    """One agent; lines two at a time."""
    return {"agents": {"list": [{"id": "main", "default": True}]}, "batches": {"maxConcurrent": 2}}


def batch_cmd(
    api_url: str, settings: Settings, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `switchboard batch …` with --url and --token, away from any running stack."""
    env = {**os.environ, "SWITCHBOARD_DATA_DIR": str(tmp_path / "cli-data")}
    for name in ("SWITCHBOARD_TOKEN", "SWITCHBOARD_CONFIG", "SWITCHBOARD_REDIS_URL"):
        env.pop(name, None)
    command = [sys.executable, "-m", "switchboard", "batch", *args]
    if args[0] != "--help":
        command += ["--url", api_url, "--token", str(settings.token)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def write_lines(path: Path, lines: list[Any]) -> Path:
    """A JSONL file (a line given as text is written as is)."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def chat(custom_id: str, text: str) -> dict[str, Any]:
    """A chat-completions line for the main agent."""
    body = {"model": "switchboard/main", "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_submit_wait_writes_results_and_errors(
    worker: Any, api_url: str, settings: Settings, tmp_path: Path
) -> None:
    """`submit --wait --out --errors` follows the batch to its end and saves both files;
    `list`, `status` and `results` show the same batch."""
    lines = [chat(f"q{i}", f"/reply answer {i}") for i in range(6)] + [chat("bad", "/fail nope")]
    src = write_lines(tmp_path / "in.jsonl", lines)
    out, errs = tmp_path / "out.jsonl", tmp_path / "errs.jsonl"
    done = batch_cmd(
        api_url,
        settings,
        tmp_path,
        "submit",
        str(src),
        "--wait",
        "--out",
        str(out),
        "--errors",
        str(errs),
    )
    assert done.returncode == 0, done.stderr
    assert "completed: 6 done, 1 failed of 7" in done.stdout
    answers = {j["custom_id"]: j for j in map(json.loads, out.read_text().splitlines())}
    assert set(answers) == {f"q{i}" for i in range(6)}
    assert answers["q3"]["response"]["body"]["choices"][0]["message"]["content"] == "answer 3"
    assert [json.loads(x)["custom_id"] for x in errs.read_text().splitlines()] == ["bad"]
    batch_id = done.stdout.split()[-8]
    listed = batch_cmd(api_url, settings, tmp_path, "list")
    assert batch_id in listed.stdout and "completed" in listed.stdout
    status = json.loads(batch_cmd(api_url, settings, tmp_path, "status", batch_id).stdout)
    assert status["request_counts"] == {"completed": 6, "failed": 1, "total": 7}
    again = batch_cmd(api_url, settings, tmp_path, "results", batch_id)
    assert len(again.stdout.splitlines()) == 6


def test_bad_file_is_one_line_naming_the_line_exit_2(
    worker: Any, api_url: str, settings: Settings, tmp_path: Path
) -> None:
    """A malformed file, or one the api refuses (an unknown model), is refused in one line
    naming the line, exit 2."""
    src = write_lines(tmp_path / "bad.jsonl", [chat("a", "x"), "{oops"])
    shaped = batch_cmd(api_url, settings, tmp_path, "submit", str(src))
    assert shaped.returncode == 2
    assert "line 2" in shaped.stderr and len(shaped.stderr.strip().splitlines()) == 1
    unknown = {
        **chat("b", "x"),
        "body": {"model": "switchboard/nobody", "messages": [{"role": "user", "content": "x"}]},
    }
    src = write_lines(tmp_path / "model.jsonl", [chat("a", "x"), unknown])
    refused = batch_cmd(api_url, settings, tmp_path, "submit", str(src), "--wait")
    assert refused.returncode == 2
    assert "line 2" in refused.stderr and "switchboard/nobody" in refused.stderr


def test_cancel_from_the_command(
    worker: Any, api_url: str, settings: Settings, tmp_path: Path
) -> None:
    """`batch cancel ID` stops a running batch."""
    src = write_lines(tmp_path / "slow.jsonl", [chat(f"s{i}", "/sleep 20") for i in range(4)])
    started = batch_cmd(api_url, settings, tmp_path, "submit", str(src))
    assert started.returncode == 0, started.stderr
    batch_id = started.stdout.strip()
    cancelled = batch_cmd(api_url, settings, tmp_path, "cancel", batch_id)
    assert cancelled.returncode == 0 and cancelled.stdout.split()[1] in ("cancelling", "cancelled")
