"""A batch survives kill -9 of the whole stack (api, worker, beat): after a restart it ends
with every line answered exactly once."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from conftest import SwitchboardProcesses

pytestmark = [pytest.mark.integration, pytest.mark.faults]

LINES = 24


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="t", max_retries=2, timeout=30)


def test_kill_9_of_everything_mid_batch_loses_no_line_and_answers_none_twice(
    switchboard_procs: SwitchboardProcesses, tmp_path: Path
) -> None:
    """Kill -9 api, worker and beat mid-batch, start them again: the batch completes with
    each custom_id in the output once."""
    config = tmp_path / "switchboard.json5"
    config.write_text(json.dumps({"batches": {"maxConcurrent": 4}, "runs": {"timeoutSeconds": 60}}))
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(config)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "switchboard/main",
                "messages": [{"role": "user", "content": f"/sleep 0.5\n/reply answer {i}"}],
            },
        }
        for i in range(LINES)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with switchboard_procs.serving(concurrency=4) as (url, _):
        oa = _client(url)
        file_id = oa.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        batch_id = oa.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        deadline = time.monotonic() + 60
        while True:
            counts = oa.batches.retrieve(batch_id).request_counts
            assert counts is not None
            if counts.completed >= 4:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        switchboard_procs.kill_all()  # mid-batch: lines in flight, most not started
    assert counts.completed < LINES
    with switchboard_procs.serving(concurrency=4) as (url, _):
        oa = _client(url)
        deadline = time.monotonic() + 120
        batch: Any = oa.batches.retrieve(batch_id)
        while batch.status != "completed":
            assert batch.status == "in_progress" and time.monotonic() < deadline, batch
            time.sleep(0.3)
            batch = oa.batches.retrieve(batch_id)
        assert batch.request_counts.completed == LINES and batch.request_counts.failed == 0
        out = oa.files.content(batch.output_file_id).text.splitlines()
        ids = [json.loads(line)["custom_id"] for line in out]
        assert sorted(ids) == sorted(f"line-{i}" for i in range(LINES))  # each once
        bodies = {json.loads(x)["custom_id"]: json.loads(x)["response"]["body"] for x in out}
        assert bodies["line-7"]["choices"][0]["message"]["content"] == "answer 7"
