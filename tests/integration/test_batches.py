"""OpenAI's Files and Batches API, driven by the real `openai` client against the api and a
worker: a mixed batch end to end, a bad file refused naming its lines, cancel, the cap."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types import Batch

from switchboard.shared.batches.lines import sweep_batches
from switchboard.shared.config import Settings
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Two agents; a batch admits at most three lines at once; a small upload limit."""
    return {
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops"}]},
        "runs": {"timeoutSeconds": 30},
        "batches": {"maxConcurrent": 3, "maxFileBytes": 64 * 1024, "maxLines": 500},
    }


@pytest.fixture
def oa(api_url: str, settings: Settings) -> Iterator[openai.OpenAI]:
    """The real OpenAI client pointed at the api (no retries: every answer is seen)."""
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=60
    ) as client:
        yield client


def chat_line(custom_id: str, text: str, model: str = "switchboard/main") -> dict[str, Any]:
    """A `/v1/chat/completions` request line."""
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def responses_line(custom_id: str, text: str, model: str = "switchboard/ops") -> dict[str, Any]:
    """A `/v1/responses` request line."""
    body = {"model": model, "input": text, "instructions": "Be brief."}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


def jsonl(lines: list[Any]) -> bytes:
    """Lines as a JSONL file (a line given as text is written as is)."""
    return b"".join(
        (line if isinstance(line, str) else json.dumps(line)).encode() + b"\n" for line in lines
    )


def upload(oa: openai.OpenAI, data: bytes) -> str:
    """Upload a batch input file; its id."""
    return oa.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_for(oa: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 60) -> Batch:
    """Poll the batch until its status is one of ``statuses``."""
    deadline = time.monotonic() + timeout
    while True:
        batch = oa.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.2)


def results(oa: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom_id."""
    if file_id is None:
        return {}
    text = oa.files.content(file_id).text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {line["custom_id"]: line for line in lines}


def test_files_upload_list_retrieve_content_delete(worker: Any, oa: openai.OpenAI) -> None:
    """An uploaded file is listed, retrievable, read back byte for byte and deletable."""
    data = jsonl([chat_line("a", "hi"), chat_line("b", "there")])
    created = oa.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert created.id.startswith("file-") and created.bytes == len(data)
    assert created.filename == "in.jsonl" and created.purpose == "batch"
    assert oa.files.retrieve(created.id).bytes == len(data)
    assert created.id in [f.id for f in oa.files.list()]
    assert oa.files.content(created.id).content == data
    second = upload(oa, data)
    page = oa.files.list(limit=1)
    assert [f.id for f in page.data] == [second] and page.has_more
    assert [f.id for f in page] == [second, created.id]  # the SDK pages on with `after`
    assert [f.id for f in oa.files.list(order="asc")] == [created.id, second]
    assert oa.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        oa.files.retrieve(created.id)


def test_upload_limits_are_a_clear_400(worker: Any, oa: openai.OpenAI) -> None:
    """A file over batches.maxFileBytes or batches.maxLines is refused with a 400 naming it."""
    with pytest.raises(openai.BadRequestError) as too_big:
        upload(oa, b"x" * (70 * 1024) + b"\n")
    assert "maxFileBytes" in too_big.value.message
    with pytest.raises(openai.BadRequestError) as too_long:
        upload(oa, b"{}\n" * 501)
    assert "maxLines" in too_long.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        oa.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="assistants")
    assert purpose.value.body["param"] == "purpose"  # type: ignore[index]


def test_mixed_batch_end_to_end(worker: Any, oa: openai.OpenAI, services: Services) -> None:
    """Chat and Responses lines each run their agent; every body is what the surface answers."""
    lines = [chat_line(f"chat-{i}", f"/reply chat answer {i}") for i in range(5)]
    lines += [responses_line(f"resp-{i}", f"/reply resp answer {i}") for i in range(3)]
    lines.append(chat_line("bad-run", "/fail the model broke"))
    chat_file = upload(oa, jsonl([line for line in lines if line["url"].endswith("completions")]))
    resp_file = upload(oa, jsonl([line for line in lines if line["url"].endswith("responses")]))
    chat = oa.batches.create(
        input_file_id=chat_file,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"purpose": "test"},
    )
    resp = oa.batches.create(
        input_file_id=resp_file, endpoint="/v1/responses", completion_window="24h"
    )
    assert chat.status == "in_progress" and chat.request_counts.total == 6  # type: ignore[union-attr]
    done = wait_for(oa, chat.id, {"completed"})
    assert done.request_counts.completed == 5 and done.request_counts.failed == 1  # type: ignore[union-attr]
    assert done.metadata == {"purpose": "test"} and done.completed_at and done.in_progress_at
    out, errs = results(oa, done.output_file_id), results(oa, done.error_file_id)
    produced = oa.files.retrieve(str(done.output_file_id))
    assert produced.purpose == "batch_output" and produced.expires_at
    assert produced.filename == f"batch_{chat.id}_output.jsonl"
    assert set(out) == {f"chat-{i}" for i in range(5)} and set(errs) == {"bad-run"}
    body = out["chat-2"]["response"]["body"]
    assert out["chat-2"]["response"]["status_code"] == 200 and out["chat-2"]["error"] is None
    assert body["object"] == "chat.completion" and body["model"] == "switchboard/main"
    assert body["choices"][0]["message"]["content"] == "chat answer 2"
    assert errs["bad-run"]["response"]["status_code"] == 502
    assert errs["bad-run"]["error"]["code"] == "run_failed"
    done_resp = wait_for(oa, resp.id, {"completed"})
    rout = results(oa, done_resp.output_file_id)
    assert done_resp.error_file_id is None and len(rout) == 3
    rbody = rout["resp-1"]["response"]["body"]
    assert rbody["object"] == "response" and rbody["status"] == "completed"
    assert rbody["output"][0]["content"][0]["text"] == "resp answer 1"
    assert rbody["model"] == "switchboard/ops" and rbody["instructions"] == "Be brief."
    request_id = out["chat-0"]["response"]["request_id"]
    run = services.store.runs.get(request_id)
    assert run is not None and run.session_key.startswith(f"agent:main:batch:{chat.id}:")
    listed = [b.id for b in oa.batches.list(limit=1).iter_pages().__next__().data]
    assert listed == [resp.id]
    assert {b.id for b in oa.batches.list()} == {chat.id, resp.id}


def test_invalid_file_fails_naming_its_lines_and_runs_nothing(
    worker: Any, oa: openai.OpenAI, services: Services
) -> None:
    """Every bad line is named with code, line and param; the batch fails and no line runs."""
    lines: list[Any] = [
        chat_line("ok-1", "fine"),
        "{not json",
        chat_line("ok-1", "a duplicate id"),
        {**chat_line("m", "x"), "method": "GET"},
        {**chat_line("u", "x"), "url": "/v1/responses"},
        chat_line("nobody", "x", model="switchboard/nobody"),
        {**chat_line("nomsg", "x"), "body": {"model": "switchboard/main"}},
    ]
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.line, e.code, e.param) for e in batch.errors.data}
    assert found == {
        (2, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_method", "method"),
        (5, "mismatched_endpoint", "url"),
        (6, "model_not_found", "body.model"),
        (7, "missing_required_parameter", "body.messages"),
    }
    time.sleep(0.5)
    assert services.store.sessions.get(f"agent:main:batch:{batch.id}:0") is None
    assert batch.request_counts is not None and batch.request_counts.total == 0


def test_a_line_nested_past_the_body_limit_is_named(worker: Any, oa: openai.OpenAI) -> None:
    """A line nesting past 64 levels (the body depth limit) fails the batch naming it."""
    deep: Any = "x"
    for _ in range(150):
        deep = [deep]
    lines = [chat_line("ok", "fine"), {**chat_line("deep", "x"), "metadata": deep}]
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    (error,) = batch.errors.data
    assert (error.line, error.code) == (2, "invalid_json_line")
    assert error.message is not None and "deeper than 64 levels" in error.message


def test_bad_batch_requests_are_400s(worker: Any, oa: openai.OpenAI) -> None:
    """An unknown endpoint, another window or an unknown file is refused in OpenAI's shape."""
    file_id = upload(oa, jsonl([chat_line("a", "x")]))
    with pytest.raises(openai.BadRequestError):
        oa.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        oa.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )
    with pytest.raises(openai.NotFoundError):
        oa.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        oa.batches.retrieve("batch_nope")


def most_at_once(services: Services, run_ids: list[str]) -> int:
    """The most of these runs that were running at the same moment (first claim to end)."""
    edges: list[tuple[int, int]] = []
    for run in services.store.runs.get_many(run_ids):
        assert run is not None and run.started_at_ms and run.ended_at_ms
        edges += [(run.started_at_ms, 1), (run.ended_at_ms, -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


def test_cap_never_more_than_max_concurrent(
    worker: Any, oa: openai.OpenAI, services: Services
) -> None:
    """A batch never runs more than batches.maxConcurrent lines at once (3 here), and a
    batch's metadata.maxConcurrent lowers it (1)."""
    lines = [chat_line(f"c{i}", f"/sleep 0.4\n/reply {i}") for i in range(10)]
    file_id = upload(oa, jsonl(lines))
    wide = oa.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    narrow = oa.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"maxConcurrent": "1"},
    )
    for batch_id, cap in ((wide.id, 3), (narrow.id, 1)):
        done = wait_for(oa, batch_id, {"completed"})
        out = results(oa, done.output_file_id)
        assert len(out) == 10
        run_ids = [line["response"]["request_id"] for line in out.values()]
        peak = most_at_once(services, run_ids)
        assert peak <= cap, f"{peak} runs of batch {batch_id} at once, cap {cap}"
        if cap > 1:
            assert peak >= 2  # the lines did run side by side


def test_cancel_stops_admitting_and_cancels_runs_in_flight(
    worker: Any, oa: openai.OpenAI, services: Services
) -> None:
    """Cancel ends the runs in flight (error lines `batch_cancelled`) and starts no more."""
    lines = [chat_line(f"c{i}", f"/sleep 20\n/reply {i}") for i in range(8)]
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    deadline = time.monotonic() + 20
    while len(services.store.batches.in_flight(batch.id)) < 3 or None in (
        services.store.batches.in_flight(batch.id).values()
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelling = oa.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_for(oa, batch.id, {"cancelled"}, timeout=30)
    assert done.cancelled_at and done.output_file_id is None
    errs = results(oa, done.error_file_id)
    assert set(errs) == {"c0", "c1", "c2"}
    assert {e["error"]["code"] for e in errs.values()} == {"batch_cancelled"}
    assert done.request_counts is not None and done.request_counts.failed == 3
    assert all(services.store.batches.run_of(batch.id, n) is None for n in range(3, 8))
    with pytest.raises(openai.ConflictError):
        oa.batches.cancel(
            wait_for(
                oa,
                oa.batches.create(
                    input_file_id=upload(oa, jsonl([chat_line("x", "hi")])),
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                ).id,
                {"completed"},
            ).id
        )


def test_metrics_count_batch_lines_by_outcome(worker: Any, oa: openai.OpenAI, client: Any) -> None:
    """/metrics counts answered batch lines by outcome."""
    lines = [chat_line("ok", "/reply yes"), chat_line("no", "/fail broken")]
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(oa, batch.id, {"completed"})
    text = client.get("/metrics").text
    assert 'switchboard_batch_lines_total{outcome="completed"} 1.0' in text
    assert 'switchboard_batch_lines_total{outcome="failed"} 1.0' in text


def test_scoped_token_sees_only_its_own_and_only_its_agent(
    worker: Any, api_url: str, oa: openai.OpenAI, services: Services
) -> None:
    """A scoped token sees only the files and batches it made; a line of another agent
    fails its batch at validation (forbidden), naming the line; its own agent's lines run."""
    issued = services.store.tokens.create("ops")
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=issued.token, max_retries=0, timeout=60
    ) as scoped:
        mine = upload(scoped, jsonl([responses_line("r", "/reply from ops")]))
        theirs = upload(oa, jsonl([chat_line("c", "hi")]))
        assert [f.id for f in scoped.files.list()] == [mine]
        assert mine not in [f.id for f in oa.files.list()]
        with pytest.raises(openai.NotFoundError):
            scoped.files.retrieve(theirs)
        with pytest.raises(openai.NotFoundError):
            scoped.files.content(theirs)
        bad = scoped.batches.create(
            input_file_id=upload(
                scoped, jsonl([chat_line("a", "x", model="switchboard/ops"), chat_line("b", "x")])
            ),
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        assert bad.status == "failed" and bad.errors is not None and bad.errors.data
        assert [(e.line, e.code) for e in bad.errors.data] == [(2, "forbidden")]
        good = scoped.batches.create(
            input_file_id=mine, endpoint="/v1/responses", completion_window="24h"
        )
        done = wait_for(scoped, good.id, {"completed"})
        assert done.request_counts is not None and done.request_counts.completed == 1
        assert {b.id for b in scoped.batches.list()} == {bad.id, good.id}
        with pytest.raises(openai.NotFoundError):
            oa.batches.retrieve(good.id)
        with pytest.raises(openai.NotFoundError):
            oa.batches.cancel(good.id)
    audited = services.store.audit.recent(50, token_id=issued.record.token_id)
    calls = {(e.surface, (e.tool or "").split(" ")[0]) for e in audited}
    assert {("files", "files.create"), ("batches", "batches.create")} <= calls
    assert ("batches", "batches.retrieve") in calls and ("files", "files.list") in calls


def test_lines_past_the_window_end_batch_expired(
    worker: Any, oa: openai.OpenAI, services: Services
) -> None:
    """Past its 24 h window a batch admits nothing more: its running and unstarted lines end
    `batch_expired` in the error file, the finished ones stay in the output, status expired."""
    lines = [chat_line("quick", "/reply done")]
    lines += [chat_line(f"slow{i}", "/sleep 20") for i in range(5)]
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"maxConcurrent": "2"},
    )
    deadline = time.monotonic() + 20
    while oa.batches.retrieve(batch.id).request_counts.completed < 1:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    while None in services.store.batches.in_flight(batch.id).values():
        time.sleep(0.05)
    # A day passes (the batch's creation moved back), then the beat's sweep looks at it.
    services.store.redis.hset(
        services.store.ks.obatch(batch.id), "createdAt", int(time.time()) - 86_401
    )
    sweep_batches(services)
    done = wait_for(oa, batch.id, {"expired"}, timeout=30)
    assert done.expired_at and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 5)
    assert set(results(oa, done.output_file_id)) == {"quick"}
    errs = results(oa, done.error_file_id)
    assert set(errs) == {f"slow{i}" for i in range(5)}
    assert {e["error"]["code"] for e in errs.values()} == {"batch_expired"}
    assert all(services.store.batches.run_of(batch.id, n) is None for n in (4, 5))


def test_sweep_starts_lines_whose_start_was_lost(oa: openai.OpenAI, services: Services) -> None:
    """A line admitted long ago with no run (its process died between admission and start)
    is started by the sweep, once; one admitted just now is left to its starter."""
    batch = oa.batches.create(  # no worker: its first admission waits in the broker
        input_file_id=upload(oa, jsonl([chat_line(f"l{i}", f"/reply {i}") for i in range(4)])),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"maxConcurrent": "2"},
    )
    store = services.store
    assert list(store.batches.admit(batch.id)) == [0, 1]  # admitted, then the process died
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    store.redis.zadd(store.ks.obatch_inflight(batch.id), {"0": an_hour_ago})
    sweep_batches(services)
    run_id = store.batches.run_of(batch.id, 0)
    assert run_id is not None and store.batches.run_of(batch.id, 1) is None
    run = store.runs.get(run_id)
    assert run is not None and run.session_key == f"agent:main:batch:{batch.id}:0"
    sweep_batches(services)  # again: the run it started is found, none is started twice
    assert store.batches.run_of(batch.id, 0) == run_id
    assert store.batches.in_flight(batch.id) == {0: run_id, 1: None}


def test_a_lines_user_names_a_shared_session(
    worker: Any, oa: openai.OpenAI, services: Services
) -> None:
    """A body's `user` runs its line in that user's session (as on the chat surface);
    lines without one each get a session of their own."""
    named = chat_line("named", "/reply hi alice")
    named["body"]["user"] = "alice"
    batch = oa.batches.create(
        input_file_id=upload(oa, jsonl([named, chat_line("own", "/reply hi")])),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    out = results(oa, wait_for(oa, batch.id, {"completed"}).output_file_id)
    sessions = {}
    for custom_id, line in out.items():
        run = services.store.runs.get(line["response"]["request_id"])
        assert run is not None
        sessions[custom_id] = run.session_key
    assert sessions == {
        "named": "agent:main:openai-user:alice",
        "own": f"agent:main:batch:{batch.id}:1",
    }
