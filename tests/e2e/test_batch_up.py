"""Batches against `switchboard up` as a user starts it: examples/batch.py through the real
`openai` SDK, and `switchboard batch submit --wait --out` finding the stack by itself."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard_testkit.up import UpProcess, clean_env, start_up

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """`switchboard up` with an empty config (the built-in echo model) in a temp dir."""
    with start_up(tmp_path_factory.mktemp("batch"), {}) as started:
        yield started


def test_example_runs_a_mixed_batch_through_the_openai_sdk(up: UpProcess) -> None:
    """examples/batch.py uploads, creates, polls and downloads chat and Responses lines."""
    env = {**clean_env(), "SWITCHBOARD_URL": up.url, "SWITCHBOARD_TOKEN": up.token}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "batch.py")],
        cwd=up.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for n in range(10):
        assert f"t-{n}: triaged: ticket {n}: the export button does nothing" in done.stdout


def test_submit_wait_out_finds_the_running_stack(up: UpProcess) -> None:
    """From the stack's directory with no settings, `batch submit --wait --out` writes the
    answers, one line per request."""
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "switchboard/main",
                "messages": [{"role": "user", "content": f"/reply answer {i}"}],
            },
        }
        for i in range(20)
    ]
    (up.workdir / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "switchboard",
            "batch",
            "submit",
            "requests.jsonl",
            "--wait",
            "--out",
            "answers.jsonl",
        ],
        cwd=up.workdir,
        env={**clean_env(), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed: 20 done, 0 failed of 20" in done.stdout
    answers = [json.loads(x) for x in (up.workdir / "answers.jsonl").read_text().splitlines()]
    assert sorted(a["custom_id"] for a in answers) == sorted(f"q{i}" for i in range(20))
    by_id = {a["custom_id"]: a["response"]["body"] for a in answers}
    assert by_id["q7"]["choices"][0]["message"]["content"] == "answer 7"
