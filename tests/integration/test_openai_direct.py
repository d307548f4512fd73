"""The short way of chat completions (`openai_direct`) sends what the OpenAI SDK sends,
answers what it answers and fails as it fails: each case runs through both clients
against one real HTTP server on loopback that records what reaches it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from aiohttp import web
from openai import AsyncOpenAI, DefaultAioHttpClient
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError
from pydantic_ai.messages import ModelRequest, UserPromptPart

from switchboard.shared.config import ProviderConfig
from switchboard.shared.runtime import models, openai_body
from switchboard.shared.runtime.openai_direct import DirectAsyncOpenAI

pytestmark = pytest.mark.integration

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "done"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
# Headers a transport adds of its own accord (not the SDK's choice).
TRANSPORT_HEADERS = {"host", "content-length", "accept-encoding", "connection"}
TOOL = {
    "type": "function",
    "function": {
        "name": "sessions_list",
        "description": "list sessions",
        "parameters": {"type": "object", "properties": {"limit": {"type": "integer"}}},
    },
}


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=lambda: COMPLETION)
    headers: dict[str, str] = field(default_factory=lambda: {"x-request-id": "req-1"})
    delay_s: float = 0.0


@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes


class Recorder:
    """What reached the server, and the replies it gives in turn (then the completion)."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.replies: list[Reply] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            Seen({k.lower(): v for k, v in request.headers.items()}, await request.read())
        )
        reply = self.replies.pop(0) if self.replies else Reply()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        text = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
        return web.Response(
            status=reply.status, text=text, content_type="application/json", headers=reply.headers
        )


@asynccontextmanager
async def server() -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1", recorder
    finally:
        await runner.cleanup()


def client_of(kind: type[AsyncOpenAI], base_url: str, **options: Any) -> AsyncOpenAI:
    return kind(base_url=base_url, api_key="sk-test", http_client=DefaultAioHttpClient(), **options)


Case = Callable[[AsyncOpenAI], Awaitable[Any]]


async def both(case: Case, replies: list[Reply] | None = None, **options: Any) -> list[Any]:
    """(outcome, what the server saw) for the SDK's client, then the direct one."""
    openai_body.install_shortcut()  # as with the fast paths on: the SDK at its fastest
    outcomes = []
    for kind in (AsyncOpenAI, DirectAsyncOpenAI):
        async with server() as (url, recorder):
            recorder.replies = list(replies or [])
            client = client_of(kind, url, **options)
            try:
                outcome: Any = await case(client)
            except Exception as exc:  # the failure is the outcome compared
                outcome = exc
            finally:
                await client.close()
            outcomes.append((outcome, recorder.seen))
    return outcomes


def create(**extra: Any) -> Case:
    async def call(client: AsyncOpenAI) -> Any:
        return await client.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            **extra,
        )

    return call


def comparable(seen: Seen) -> tuple[dict[str, str], Any]:
    headers = {k: v for k, v in seen.headers.items() if k not in TRANSPORT_HEADERS}
    return headers, json.loads(seen.body)


def test_the_same_request_and_answer_as_the_sdk() -> None:
    extra = {
        "tools": [TOOL],
        "temperature": 0.5,
        "extra_headers": {"User-Agent": "pydantic-ai/test", "X-Extra": "1"},
        "extra_body": {"custom": {"a": [1, 2]}},
        "timeout": 30.0,
    }
    (sdk, sdk_seen), (direct, direct_seen) = asyncio.run(both(create(**extra)))
    assert len(sdk_seen) == len(direct_seen) == 1
    assert comparable(direct_seen[0]) == comparable(sdk_seen[0])
    assert direct_seen[0].headers["authorization"] == "Bearer sk-test"
    assert direct_seen[0].headers["x-stainless-read-timeout"] == "30.0"
    assert json.loads(direct_seen[0].body)["custom"] == {"a": [1, 2]}
    assert type(direct) is type(sdk) is openai.types.chat.ChatCompletion
    assert direct.model_dump() == sdk.model_dump()
    assert direct._request_id == sdk._request_id == "req-1"


def test_the_short_way_is_taken() -> None:
    """The direct client does not go through the SDK's request building at all."""

    async def case(client: AsyncOpenAI) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the SDK built a request")

        client._build_request = refuse  # type: ignore[method-assign]
        return await create()(client)

    (sdk, _), (direct, seen) = asyncio.run(both(case))
    assert isinstance(sdk, AssertionError)
    assert direct.choices[0].message.content == "done" and len(seen) == 1


def count_builds(client: AsyncOpenAI) -> list[int]:
    """One item per request the SDK's request building makes for ``client`` from now on."""
    built: list[int] = []
    original = client._build_request

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return original(*args, **kwargs)

    client._build_request = spy  # type: ignore[method-assign]
    return built


def test_a_request_with_an_extra_query_is_the_sdks() -> None:
    async def case(client: AsyncOpenAI) -> Any:
        built = count_builds(client)
        await create(extra_query={"q": "1"})(client)
        return len(built)

    (sdk, _), (direct, _) = asyncio.run(both(case))
    assert direct == sdk == 1


def test_a_request_through_a_proxy_is_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy from the environment is the SDK's to use: the short way steps aside."""

    async def case(client: AsyncOpenAI) -> Any:
        built = count_builds(client)
        with contextlib.suppress(openai.APIConnectionError):  # no proxy listens there
            await create()(client)
        return len(built)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    (sdk, _), (direct, seen) = asyncio.run(both(case, max_retries=0))
    assert direct == sdk == 1 and seen == []


def test_retried_as_the_sdk_retries() -> None:
    replies = [
        Reply(status=500, body={"error": {"message": "down"}}, headers={"retry-after-ms": "10"}),
        Reply(status=429, body={"error": {"message": "slow"}}, headers={"retry-after-ms": "10"}),
    ]
    (sdk, sdk_seen), (direct, direct_seen) = asyncio.run(both(create(), replies))
    assert direct.model_dump() == sdk.model_dump()
    counts = [
        [s.headers["x-stainless-retry-count"] for s in seen] for seen in (sdk_seen, direct_seen)
    ]
    assert counts == [["0", "1", "2"], ["0", "1", "2"]]


def test_not_retried_when_the_server_says_so() -> None:
    no = {"x-should-retry": "false"}
    replies = [Reply(status=500, body={"error": {"message": "no"}}, headers=no)]
    (sdk, sdk_seen), (direct, direct_seen) = asyncio.run(both(create(), replies))
    assert type(direct) is type(sdk) is openai.InternalServerError
    assert len(direct_seen) == len(sdk_seen) == 1


def test_a_refusal_raises_the_sdks_error() -> None:
    body = {"error": {"message": "bad model", "type": "invalid_request_error", "code": "nope"}}
    (sdk, _), (direct, seen) = asyncio.run(both(create(), [Reply(status=400, body=body)]))
    assert type(direct) is type(sdk) is openai.BadRequestError
    assert (direct.status_code, direct.body, direct.code, str(direct)) == (
        sdk.status_code,
        sdk.body,
        sdk.code,
        str(sdk),
    )
    assert direct.response.headers["x-request-id"] == "req-1" and len(seen) == 1


def test_a_server_that_does_not_answer_in_time() -> None:
    replies = [Reply(delay_s=2.0)]
    (sdk, _), (direct, _) = asyncio.run(both(create(timeout=0.2), replies, max_retries=0))
    assert type(direct) is type(sdk) is openai.APITimeoutError


def test_no_server() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def run(kind: type[AsyncOpenAI]) -> Exception:
        client = client_of(kind, f"http://127.0.0.1:{port}/v1", max_retries=1)
        try:
            await create()(client)
        except Exception as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("answered")

    sdk, direct = (asyncio.run(run(kind)) for kind in (AsyncOpenAI, DirectAsyncOpenAI))
    # The SDK's aiohttp transport counts a refused connection as a connect timeout.
    assert type(direct) is type(sdk) is openai.APITimeoutError
    assert isinstance(direct, openai.APIConnectionError)


def test_an_answer_that_is_not_json() -> None:
    (_, _), (direct, _) = asyncio.run(both(create(), [Reply(body="<html>oops")]))
    assert isinstance(direct, openai.APIResponseValidationError)


def test_closing_the_client_closes_its_connections() -> None:
    async def case(client: AsyncOpenAI) -> Any:
        await create()(client)
        session = client._client._transport.client  # type: ignore[attr-defined]
        await client.close()
        return session.closed

    (sdk, _), (direct, _) = asyncio.run(both(case))
    assert direct is sdk is True


# -- through pydantic-ai, as a run calls it ----------------------------------------------


class Provider:
    api = "openai-completions"
    api_key = "sk-test"

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


async def run_request(base_url: str, fast_paths: bool) -> Any:
    models.clear_model_cache()
    model = models.resolve_model("fake/m", {"fake": Provider(base_url)}, fast_paths=fast_paths)
    client = model.client
    messages = [ModelRequest(parts=[UserPromptPart("hi")], instructions="be brief")]
    try:
        return type(client), await model_request(model, messages, instrument=False)
    except Exception as exc:
        return type(client), exc
    finally:
        await client.close()  # a client handed to the provider is the caller's to close
        models.clear_model_cache()


@pytest.mark.parametrize("fast_paths", [True, False])
def test_a_run_uses_it_only_with_the_fast_paths(fast_paths: bool) -> None:
    async def case() -> Any:
        async with server() as (url, recorder):
            kind, response = await run_request(url, fast_paths)
            return kind, response, recorder.seen

    kind, response, seen = asyncio.run(case())
    assert (kind is DirectAsyncOpenAI) is fast_paths
    assert issubclass(kind, AsyncOpenAI)
    assert response.text == "done" and response.provider_response_id == "chatcmpl-1"
    assert len(seen) == 1


def test_a_run_maps_its_failures_as_before() -> None:
    async def case(status: int) -> list[Any]:
        outcomes = []
        for fast_paths in (True, False):
            async with server() as (url, recorder):
                recorder.replies = [Reply(status=status, body={"error": {"message": "x"}})] * 3
                outcomes.append((await run_request(url, fast_paths))[1])
        return outcomes

    direct, sdk = asyncio.run(case(400))
    assert type(direct) is type(sdk) and isinstance(direct, ModelHTTPError)
    assert (direct.status_code, direct.body) == (sdk.status_code, sdk.body)
    assert direct.status_code == 400 and direct.body == {"message": "x"}
    direct, sdk = asyncio.run(case(503))
    assert type(direct) is type(sdk) and isinstance(direct, ModelHTTPError)
    assert direct.status_code == sdk.status_code == 503 and isinstance(direct, ModelAPIError)


def test_config_provider_builds_it() -> None:
    provider = ProviderConfig(baseUrl="http://127.0.0.1:1/v1", apiKey="k", api="openai-completions")
    models.clear_model_cache()
    model = models.resolve_model("fake/m", {"fake": provider}, fast_paths=True)
    assert type(model.client) is DirectAsyncOpenAI
    models.clear_model_cache()
