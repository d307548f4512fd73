"""Chat completions straight onto the SDK's aiohttp session, past its request machinery.

A worker makes thousands of chat-completion requests at once, and for each the OpenAI
SDK builds its request options, an httpx request (URL parsing, header merging), sends it
through httpx's client (auth, redirects) to its aiohttp transport, and wraps the answer in
httpx and SDK response objects again: in a fan-out of 10,000 sub-agents that was about a
third of the worker's CPU, three times what aiohttp itself spends (docs/performance.md,
"Chat completions the short way").

`DirectAsyncOpenAI` is the SDK's `AsyncOpenAI`, and its `chat.completions.create` takes the
short way for every request it can, which is what a run sends: not streamed, the client's
own aiohttp transport, no extra query, a body of plain JSON data. On it:

- the body is the one the SDK sends (`openai_body.plain_body`, the extra body merged on top,
  dumped by the SDK's `openapi_dumps`);
- the headers are the ones the SDK's `_build_headers` makes for the client (worked out once
  per client), with the request's own: its extra headers, the retry count, the read timeout;
- the POST goes on the transport's aiohttp session: the same pool of connections, closed
  with the client;
- the answer becomes a chat completion as the SDK's would (`openai_body.parsed_completion`,
  else the SDK's own `_process_response_data`), with its request id;
- a failure goes through the SDK's own rules: which statuses and errors are retried
  (`_should_retry`), how long to wait (`_calculate_retry_timeout`, honouring the server's
  `retry-after`), the error raised (`_make_status_error_from_response`, `APIConnectionError`,
  `APITimeoutError`), so pydantic-ai maps it as it maps the SDK's.

Any other request (streamed, with an extra query, a body the SDK would transform, a client
on another transport or behind a proxy) is the SDK's. Built only with the fast paths on
(``Settings.fast_paths``, in `models._openai_provider`); off, the client is the SDK's
`AsyncOpenAI` itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from functools import cached_property
from typing import Any, cast

import aiohttp
import httpx2
from openai import APIConnectionError, APIResponseValidationError, APITimeoutError, AsyncOpenAI
from openai._models import FinalRequestOptions, add_request_id
from openai._types import Omit
from openai._utils import is_given
from openai._utils._json import openapi_dumps
from openai._vendor.httpx_aiohttp.transport import AiohttpTransport, map_aiohttp_exceptions
from openai.resources.chat import AsyncChat
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion, completion_create_params

from switchboard.shared.runtime import openai_body

__all__ = ["DirectAsyncOpenAI"]

_PATH = "/chat/completions"
# The arguments of `create` that are request options, not body fields.
_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
_NON_STREAMING = completion_create_params.CompletionCreateParamsNonStreaming


class DirectAsyncOpenAI(AsyncOpenAI):
    """`AsyncOpenAI` whose chat completions take the short way where they can (module doc)."""

    @cached_property
    def chat(self) -> AsyncChat:
        return _DirectChat(self)

    @cached_property
    def _direct_headers(self) -> dict[str, str]:
        """The headers the SDK sends on a chat completion of this client's, but for the
        request's own (lower-case names)."""
        options = FinalRequestOptions.construct(
            method="post", url=_PATH, security={"bearer_auth": True}
        )
        headers = self._build_headers(options)
        for own in ("x-stainless-retry-count", "x-stainless-read-timeout"):
            headers.pop(own, None)
        return dict(headers.items())

    @cached_property
    def _direct_url(self) -> str:
        return str(self._prepare_url(_PATH))

    @cached_property
    def _direct_transport(self) -> AiohttpTransport | None:
        """The SDK's aiohttp transport for this client's chat completions; None when
        another one serves them (a proxy from the environment, a transport of the caller's)."""
        client = self._client
        transport = client._transport_for_url(httpx2.URL(self._direct_url))
        if transport is not client._transport or not isinstance(transport, AiohttpTransport):
            return None
        return transport

    def _direct_session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session of this client's transport (opened here if it is not yet);
        None when the short way is not this client's (`_direct_transport`)."""
        transport = self._direct_transport
        if transport is None:
            return None
        if not isinstance(transport.client, aiohttp.ClientSession):
            transport.client = transport.get_client()
        return transport.client


class _DirectChat(AsyncChat):
    @cached_property
    def completions(self) -> AsyncCompletions:
        return _DirectCompletions(self._client)


class _DirectCompletions(AsyncCompletions):
    _client: DirectAsyncOpenAI

    async def create(self, **params: Any) -> Any:
        request = _direct_request(self._client, params)
        if request is None:
            return await super().create(**params)
        return await _send(self._client, *request)


_Request = tuple[aiohttp.ClientSession, bytes, dict[str, str], httpx2.Timeout | float | None]


def _direct_request(client: DirectAsyncOpenAI, params: Mapping[str, Any]) -> _Request | None:
    """What the short way sends for these `create` arguments; None when it is the SDK's."""
    if params.get("stream") or params.get("extra_query"):
        return None
    data = {k: v for k, v in params.items() if k not in _OPTIONS}
    body = openai_body.plain_body(data, _NON_STREAMING)
    if body is None:
        return None
    extra_body = params.get("extra_body")
    if extra_body:
        body = {k: v for k, v in {**body, **extra_body}.items() if not isinstance(v, Omit)}
        if not openai_body.is_plain(body):
            return None
    session = client._direct_session()
    if session is None:
        return None
    timeout = params.get("timeout")
    timeout = client.timeout if not is_given(timeout) else timeout
    headers = dict(client._direct_headers)
    for name, value in (params.get("extra_headers") or {}).items():
        if isinstance(value, Omit):
            headers.pop(name.lower(), None)
        else:
            headers[name.lower()] = value
    read_s = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
    if read_s is not None:
        headers["x-stainless-read-timeout"] = str(read_s)
    return session, openapi_dumps(body), headers, timeout


async def _send(
    client: DirectAsyncOpenAI,
    session: aiohttp.ClientSession,
    body: bytes,
    headers: dict[str, str],
    timeout: httpx2.Timeout | float | None,
) -> ChatCompletion:
    """POST the request, retried as the SDK retries it; its chat completion."""
    max_retries = client.max_retries
    for retries_taken in range(max_retries + 1):
        headers["x-stainless-retry-count"] = str(retries_taken)
        remaining = max_retries - retries_taken
        try:
            async with session.post(
                client._direct_url, data=body, headers=headers, timeout=_client_timeout(timeout)
            ) as answer:
                status, content = answer.status, await answer.read()
                if 200 <= status < 300:
                    return _completion(client, content, answer.headers.get("x-request-id"))
                answer_headers = list(answer.headers.items())
        except (TimeoutError, aiohttp.ClientError) as exc:
            if remaining > 0:
                await asyncio.sleep(client._calculate_retry_timeout(remaining, _options(), None))
                continue
            raise _transport_error(exc, _httpx_request(client, headers, body)) from exc
        response = httpx2.Response(
            status,
            headers=answer_headers,
            content=content,
            request=_httpx_request(client, headers, body),
        )
        if remaining > 0 and client._should_retry(response):
            await asyncio.sleep(
                client._calculate_retry_timeout(remaining, _options(), response.headers)
            )
            continue
        raise client._make_status_error_from_response(response)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _completion(
    client: DirectAsyncOpenAI, content: bytes, request_id: str | None
) -> ChatCompletion:
    """The answer of a 2xx as the SDK makes it: a chat completion with its request id."""
    try:
        data = json.loads(content)
    except ValueError as exc:
        response = _ok_response(client, content)
        raise APIResponseValidationError(
            response=response, body=response.text, message="the answer is not JSON"
        ) from exc
    parsed: ChatCompletion | None = None
    if not client._strict_response_validation:
        parsed = cast("ChatCompletion | None", openai_body.parsed_completion(data, ChatCompletion))
    if parsed is None:  # the SDK's own construct (or its strict validation)
        response = _ok_response(client, content)
        parsed = client._process_response_data(data=data, cast_to=ChatCompletion, response=response)
    add_request_id(parsed, request_id)
    return parsed


def _ok_response(client: DirectAsyncOpenAI, content: bytes) -> httpx2.Response:
    """A 2xx answer as an httpx response, for the SDK's code that takes one (off the hot path)."""
    return httpx2.Response(200, content=content, request=httpx2.Request("POST", client._direct_url))


def _client_timeout(timeout: httpx2.Timeout | float | None) -> aiohttp.ClientTimeout:
    """The SDK transport's mapping of an httpx timeout onto aiohttp's."""
    if isinstance(timeout, httpx2.Timeout):
        return aiohttp.ClientTimeout(
            sock_connect=timeout.connect, sock_read=timeout.read, connect=timeout.pool
        )
    return aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout, connect=timeout)


def _transport_error(exc: BaseException, request: httpx2.Request) -> APIConnectionError:
    """The SDK's error for a request its transport could not make: its transport's mapping
    of aiohttp's errors decides whether it timed out (a refused connection does, there)."""
    try:
        with map_aiohttp_exceptions():
            raise exc
    except httpx2.TimeoutException:
        return APITimeoutError(request=request)
    except BaseException:
        return APIConnectionError(request=request)


def _options() -> FinalRequestOptions:
    return FinalRequestOptions.construct(method="post", url=_PATH)


def _httpx_request(
    client: DirectAsyncOpenAI, headers: Mapping[str, str], body: bytes
) -> httpx2.Request:
    """The request as an httpx request: what the SDK's errors carry."""
    return httpx2.Request("POST", client._direct_url, headers=headers, content=body)
