"""Tracing over OTLP/HTTP: a real api and worker export to a loopback OTLP receiver, and
one send's request, runs and model calls form one trace with the GenAI attributes."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard_testkit.up import free_port

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the otel extra is not installed",
)

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
PEER = "agent:main:hook:peer"


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback: keeps every span posted to /v1/traces,
    each as a dict with its service name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver.take(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def take(self, body: bytes) -> None:
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "service": resource.get("service.name"),
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "attributes": _attributes(span.attributes),
                        }
                    )
        with self.lock:
            self.spans += found

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in pairs:
        value = kv.value
        field = value.WhichOneof("value")
        out[kv.key] = getattr(value, field) if field else None
    return out


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    """A loopback OTLP/HTTP receiver, stopped at teardown."""
    receiver = OtlpReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the api did not start")


def _spans_until(otlp: OtlpReceiver, found: Any, what: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = found(otlp.snapshot())
        if result:
            return result
        assert time.monotonic() < deadline, f"no {what} among {len(otlp.snapshot())} spans"
        time.sleep(0.1)


@pytest.fixture
def traced_api(switchboard_procs: Any, otlp: OtlpReceiver, tmp_path: Path) -> str:
    """A real api, worker and beat exporting to ``otlp`` (batches every 50 ms): the api's
    URL, healthy."""
    config = {"tools": {"sessions": {"visibility": "agent"}}}
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    switchboard_procs.env.update(
        {
            "SWITCHBOARD_CONFIG": str(config_file),
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
    )
    port = free_port()
    switchboard_procs("api", "--port", str(port))
    switchboard_procs("worker", "--concurrency", "4")
    switchboard_procs("beat")
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url)
    return url


def _run_to_end(url: str, message: str) -> str:
    """Start a run in the main session over HTTP, wait for it to end ok: its id."""
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}, timeout=60) as client:
        started = client.post("/rpc", json={"method": "agent", "params": {"message": message}})
        assert started.status_code == 200, started.text
        run_id: str = started.json()["runId"]
        params = {"runId": run_id, "timeoutMs": 30_000}
        waited = client.post("/rpc", json={"method": "agent.wait", "params": params})
        assert waited.json()["status"] == "ok", waited.text
    return run_id


def _run_span(otlp: OtlpReceiver, run_id: str) -> dict[str, Any]:
    """The (first ended) `invoke_agent` span of a run, with its usage recorded."""

    def found(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            s
            for s in spans
            if s["name"].startswith("invoke_agent")
            and s["attributes"].get("switchboard.run_id") == run_id
            and "gen_ai.usage.input_tokens" in s["attributes"]
        ]

    span: dict[str, Any] = _spans_until(otlp, found, f"invoke_agent span of run {run_id}")[0]
    return span


def test_a_send_is_one_trace_across_api_and_worker_with_genai_attributes(
    traced_api: str, otlp: OtlpReceiver
) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, an agent run started over HTTP whose model
    sends to another session exports one trace: the api's server span, the worker's
    `invoke_agent` span of the run (a GenAI span with model, usage, session key and run
    id), its `chat` spans, and the send's target run under the requester's run; beat
    exports too."""
    send = {"sessionKey": "hook:peer", "message": "/reply pong", "timeoutSeconds": 20}
    run_id = _run_to_end(traced_api, f"/tool sessions_send {json.dumps(send)}")
    agent_span = _run_span(otlp, run_id)
    trace_id = agent_span["trace_id"]
    attrs = agent_span["attributes"]
    assert agent_span["service"] == "switchboard-worker"
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "main"
    assert attrs["gen_ai.request.model"] == "echo"
    assert attrs["switchboard.session_key"] == MAIN
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0

    def in_trace(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["trace_id"] == trace_id]

    def peer_run(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            s
            for s in in_trace(spans)
            if s["name"].startswith("invoke_agent")
            and s["attributes"].get("switchboard.session_key") == PEER
        ]

    peers = _spans_until(otlp, peer_run, "invoke_agent span of the send's target run")
    # The target run was created by the requester's tool call: its span's parent.
    assert agent_span["span_id"] in {p["parent_id"] for p in peers}
    spans = in_trace(otlp.snapshot())
    server = [s for s in spans if s["service"] == "switchboard-api" and s["kind"] == 2]
    assert server, "no api server span in the run's trace"
    chats = [s for s in spans if s["name"].startswith("chat")]
    assert chats, "no chat span in the run's trace"
    chat = next(s for s in chats if s["attributes"].get("switchboard.run_id") == run_id)
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.request.model"] == "echo"
    assert chat["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert chat["parent_id"] in {s["span_id"] for s in spans if s["name"].startswith("invoke")}

    def from_beat(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["service"] == "switchboard-beat"]

    _spans_until(otlp, from_beat, "span from beat (its sweep sent)")


def test_a_spawned_child_run_is_in_the_requesters_trace(
    traced_api: str, otlp: OtlpReceiver
) -> None:
    """A sub-agent spawned by a run executes under the requester's `invoke_agent` span, in
    its trace."""
    spawn = {"task": "/reply child done", "label": "traced"}
    run_id = _run_to_end(traced_api, f"/tool sessions_spawn {json.dumps(spawn)}")
    parent = _run_span(otlp, run_id)

    def children(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            s
            for s in spans
            if s["name"].startswith("invoke_agent")
            and ":subagent:" in str(s["attributes"].get("switchboard.session_key"))
        ]

    [child] = _spans_until(otlp, children, "invoke_agent span of the spawned child")
    assert child["trace_id"] == parent["trace_id"]
    assert child["parent_id"] == parent["span_id"]
