"""A fake OpenAI-compatible model server for tests and benchmarks, scriptable over HTTP.

`POST /v1/chat/completions` (plain or `stream: true` SSE) and `GET /v1/models` behave like
OpenAI's. By default a request is answered with the directive rules of `builtin/echo` (see
`switchboard.shared.runtime.echo`), read from the latest user message: `/tool` lines become
`tool_calls`, and after `tool` messages the reply is their content, one per line. `/fail`
answers HTTP 400 (not retried by clients). Usage counts whitespace-separated words of all
request messages (prompt) and of the reply (completion).

Control endpoints:

    POST /_script  {"replies": [{"content": "...", "tool_calls": [...], "latency_ms": 0,
                                 "status": 200}]}   queue replies, consumed FIFO, one per request
                   (tool calls as OpenAI's `{"id"?, "function": {"name", "arguments"}}` or
                   `{"id"?, "name", "arguments"}`; a reply's latency replaces the default)
    POST /_config  {"latency_ms": N}   default latency of every request
    GET  /_requests                    the recorded request bodies (the last 1000)
    POST /_reset                       empty the script and the record, restore the latency

`FakeModelServer` runs it on a free loopback port in a background thread; from a shell:
`python -m switchboard_testkit.fake_model --port 8781 --latency-ms 50`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from switchboard.shared.runtime.echo import (
    DirectiveError,
    Directives,
    count_words,
    parse_directives,
    reply_after_tools,
    reply_without_tools,
)

__all__ = ["FakeModelServer", "create_app", "main"]

MODEL_ID = "fake-model"
REQUEST_LOG_SIZE = 1000

Json = dict[str, Any]


@dataclass
class _Reply:
    """One answer: text and/or tool calls, or an HTTP error when `status` is not 200."""

    content: str | None = None
    tool_calls: list[Json] = field(default_factory=list)
    latency_ms: float | None = None
    status: int = 200


@dataclass
class _State:
    """What the control endpoints change; touched only from the server's event loop."""

    default_latency_ms: float
    latency_ms: float = 0.0
    script: deque[Json] = field(default_factory=deque)
    requests: deque[Json] = field(default_factory=lambda: deque(maxlen=REQUEST_LOG_SIZE))
    ids: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.latency_ms = self.default_latency_ms

    def reset(self) -> None:
        self.latency_ms = self.default_latency_ms
        self.script.clear()
        self.requests.clear()


def create_app(*, latency_ms: float = 0) -> FastAPI:
    """Build the fake server; `latency_ms` is the default delay before every answer."""
    app = FastAPI(title="switchboard fake model", docs_url=None, redoc_url=None)
    state = _State(default_latency_ms=latency_ms)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body: Json = await request.json()
        state.requests.append(body)
        reply = _Reply(**state.script.popleft()) if state.script else _directive_reply(body)
        latency = state.latency_ms if reply.latency_ms is None else reply.latency_ms
        await asyncio.sleep(latency / 1000)
        if reply.status != 200:
            return _error_response(reply)
        seq = next(state.ids)
        if body.get("stream"):
            chunks = _stream_chunks(seq, body, reply)
            return StreamingResponse(chunks, media_type="text/event-stream")
        return JSONResponse(_completion(seq, body, reply))

    @app.get("/v1/models")
    async def models() -> Json:
        return {"object": "list", "data": [_model_card(MODEL_ID)]}

    @app.post("/_script")
    async def script(payload: Json) -> Response:
        replies = payload.get("replies", [])
        try:
            for reply in replies:
                _Reply(**reply)  # reject unknown fields before queueing anything
        except TypeError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        state.script.extend(replies)
        return JSONResponse({"queued": len(state.script)})

    @app.post("/_config")
    async def config(payload: Json) -> Json:
        if "latency_ms" in payload:
            state.latency_ms = float(payload["latency_ms"])
        return {"latency_ms": state.latency_ms}

    @app.get("/_requests")
    async def requests() -> list[Json]:
        return list(state.requests)

    @app.post("/_reset")
    async def reset() -> Json:
        state.reset()
        return {"ok": True}

    return app


# ---- default behaviour: the echo directives ----


def _directive_reply(body: Json) -> _Reply:
    messages: list[Json] = body.get("messages") or []
    try:
        directives = parse_directives(_latest_user_text(messages))
    except DirectiveError as exc:
        return _Reply(content=str(exc), status=400)
    if messages and messages[-1].get("role") == "tool":
        return _Reply(content=reply_after_tools(directives, _trailing_tool_texts(messages)))
    if directives.fail is not None:
        return _Reply(content=directives.fail, latency_ms=_sleep_ms(directives), status=400)
    if directives.tool_calls:
        first_id = _tool_call_count(messages) + 1
        calls = [
            _tool_call(f"echo_{first_id + index}", call.name, call.args)
            for index, call in enumerate(directives.tool_calls)
        ]
        return _Reply(tool_calls=calls, latency_ms=_sleep_ms(directives))
    return _Reply(content=reply_without_tools(directives), latency_ms=_sleep_ms(directives))


def _sleep_ms(directives: Directives) -> float | None:
    return directives.sleep_s * 1000 if directives.sleep_s else None


def _latest_user_text(messages: Sequence[Json]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _trailing_tool_texts(messages: Sequence[Json]) -> list[str]:
    texts: list[str] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        texts.append(_text(message.get("content")))
    return texts[::-1]


def _tool_call_count(messages: Sequence[Json]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


# ---- the OpenAI wire format ----


def _tool_call(call_id: str, name: str, arguments: Any) -> Json:
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _normalized_calls(seq: int, reply: _Reply) -> list[Json]:
    calls = []
    for index, raw in enumerate(reply.tool_calls, start=1):
        function = raw.get("function") or raw
        call_id = raw.get("id") or f"call_{seq}_{index}"
        calls.append(_tool_call(call_id, function["name"], function.get("arguments") or {}))
    return calls


def _usage(body: Json, reply: _Reply, calls: Sequence[Json]) -> Json:
    prompt = count_words(_message_texts(body.get("messages") or []))
    completion = count_words([reply.content or "", *_call_texts(calls)])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _message_texts(messages: Sequence[Json]) -> Iterator[str]:
    for message in messages:
        yield _text(message.get("content"))
        yield from _call_texts(message.get("tool_calls") or [])


def _call_texts(calls: Sequence[Json]) -> Iterator[str]:
    for call in calls:
        function = call.get("function") or {}
        yield f"{function.get('name', '')} {function.get('arguments', '')}"


def _completion(seq: int, body: Json, reply: _Reply) -> Json:
    calls = _normalized_calls(seq, reply)
    message: Json = {"role": "assistant", "content": reply.content if reply.content else None}
    if calls:
        message["tool_calls"] = calls
    return {
        **_envelope(seq, body, "chat.completion"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish(calls), "logprobs": None}
        ],
        "usage": _usage(body, reply, calls),
    }


async def _stream_chunks(seq: int, body: Json, reply: _Reply) -> AsyncIterator[bytes]:
    calls = _normalized_calls(seq, reply)
    envelope = _envelope(seq, body, "chat.completion.chunk")

    def chunk(delta: Json, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse({**envelope, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in re.findall(r"\s*\S+\s*", reply.content or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(calls):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, _finish(calls))
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _sse({**envelope, "choices": [], "usage": _usage(body, reply, calls)})
    yield b"data: [DONE]\n\n"


def _sse(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _envelope(seq: int, body: Json, kind: str) -> Json:
    return {
        "id": f"chatcmpl-{seq}",
        "object": kind,
        "created": int(time.time()),
        "model": body.get("model") or MODEL_ID,
        "system_fingerprint": "fp_switchboard_fake",
    }


def _finish(calls: Sequence[Json]) -> str:
    return "tool_calls" if calls else "stop"


def _error_response(reply: _Reply) -> JSONResponse:
    kind = "server_error" if reply.status >= 500 else "invalid_request_error"
    message = reply.content or f"scripted error {reply.status}"
    error = {"message": message, "type": kind, "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=reply.status)


def _model_card(model_id: str) -> Json:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "switchboard"}


# ---- running it ----


class FakeModelServer:
    """Run the fake server with uvicorn in a background thread on a free loopback port."""

    def __init__(self, *, latency_ms: float = 0, host: str = "127.0.0.1") -> None:
        self._app = create_app(latency_ms=latency_ms)
        self._host = host
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The server root, e.g. `http://127.0.0.1:43121`."""
        if self._port is None:
            raise RuntimeError("FakeModelServer is not started")
        return f"http://{self._host}:{self._port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to configure a provider with (`<url>/v1`)."""
        return f"{self.url}/v1"

    def start(self, timeout_s: float = 10.0) -> FakeModelServer:
        """Bind a free port, serve in a daemon thread and wait until it accepts requests."""
        # proto=IPPROTO_TCP: asyncio only sets TCP_NODELAY on connections accepted from such a
        # socket; without it every response waits ~40 ms on Nagle and delayed ACKs.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-model", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake model server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def script(self, *replies: Mapping[str, Any]) -> None:
        """Queue scripted replies (see `POST /_script`)."""
        self._post("/_script", {"replies": list(replies)})

    def configure(self, *, latency_ms: float) -> None:
        """Set the default latency of every request."""
        self._post("/_config", {"latency_ms": latency_ms})

    def requests(self) -> list[Json]:
        """The recorded request bodies, oldest first."""
        response = httpx.get(f"{self.url}/_requests")
        response.raise_for_status()
        records: list[Json] = response.json()
        return records

    def reset(self) -> None:
        """Empty the script and the record and restore the default latency."""
        self._post("/_reset", {})

    def _post(self, path: str, payload: Json) -> None:
        httpx.post(f"{self.url}{path}", json=payload).raise_for_status()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: serve the fake model in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m switchboard_testkit.fake_model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8781)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    uvicorn.run(create_app(latency_ms=args.latency_ms), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
