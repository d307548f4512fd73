"""A batch of agent runs through OpenAI's Batch API: upload, create, poll, download.

Start Switchboard in one terminal, then run this in another:

    switchboard up
    .venv/bin/python examples/batch.py

It writes a JSONL file of ten ticket-triage requests (chat completions and Responses lines
of the `main` agent; with the offline `builtin/echo` model each answer is its `/reply`
line), uploads it with the `openai` SDK, creates a batch on it, polls its progress, and
prints the answers by `custom_id`. The same file runs from the shell with
`switchboard batch submit FILE --wait --out answers.jsonl`. Environment: SWITCHBOARD_URL
(default http://127.0.0.1:8780), SWITCHBOARD_TOKEN (default: ./.switchboard/token).
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

from openai import OpenAI

URL = os.environ.get("SWITCHBOARD_URL", "http://127.0.0.1:8780")
TOKEN = os.environ.get("SWITCHBOARD_TOKEN") or Path(".switchboard/token").read_text().strip()
TICKETS = [f"ticket {n}: the export button does nothing" for n in range(10)]


def request_line(n: int, ticket: str) -> dict[str, object]:
    """One request: a chat completion for even tickets, a Responses request for odd ones."""
    text = f"Triage this.\n/reply triaged: {ticket} -> priority {n % 3 + 1}"
    if n % 2 == 0:
        body: dict[str, object] = {
            "model": "switchboard/main",
            "messages": [
                {"role": "system", "content": "You triage tickets."},
                {"role": "user", "content": text},
            ],
        }
        return {
            "custom_id": f"t-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
    body = {"model": "switchboard/main", "input": text, "instructions": "You triage tickets."}
    return {"custom_id": f"t-{n}", "method": "POST", "url": "/v1/responses", "body": body}


def run_batch(client: OpenAI, endpoint: str, lines: list[dict[str, object]]) -> dict[str, str]:
    """Upload the lines, run them as one batch, and return each answer's text by custom_id."""
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = client.files.create(file=("tickets.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint=endpoint, completion_window="24h"
    )  # type: ignore[arg-type]
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        counts = batch.request_counts
        print(f"{batch.id} {batch.status}: {counts.completed if counts else 0} done", flush=True)
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    if batch.status == "failed":
        raise SystemExit(f"the file was refused: {batch.errors}")
    answers: dict[str, str] = {}
    for raw in client.files.content(batch.output_file_id or "").text.splitlines():
        line = json.loads(raw)
        body = line["response"]["body"]
        if "choices" in body:
            answers[line["custom_id"]] = body["choices"][0]["message"]["content"]
        else:
            answers[line["custom_id"]] = body["output"][0]["content"][0]["text"]
    if batch.error_file_id:
        print(client.files.content(batch.error_file_id).text)
    return answers


def main() -> None:
    """Run the chat lines and the Responses lines as two batches (a batch has one endpoint)."""
    client = OpenAI(base_url=f"{URL}/v1", api_key=TOKEN)
    lines = [request_line(n, t) for n, t in enumerate(TICKETS)]
    answers: dict[str, str] = {}
    for endpoint in ("/v1/chat/completions", "/v1/responses"):
        answers |= run_batch(client, endpoint, [x for x in lines if x["url"] == endpoint])
    for custom_id in sorted(answers, key=lambda c: int(c.split("-")[1])):
        print(f"{custom_id}: {answers[custom_id]}")


if __name__ == "__main__":
    main()
