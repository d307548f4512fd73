"""The chat-completion body shortcut gives exactly what the OpenAI SDK's transform gives."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest
from openai import NOT_GIVEN, omit
from openai._utils import PropertyInfo, async_maybe_transform
from openai.types.chat import completion_create_params as params

from switchboard.shared.runtime import openai_body

pytestmark = pytest.mark.unit

NON_STREAMING = params.CompletionCreateParamsNonStreaming
STREAMING = params.CompletionCreateParamsStreaming

SCHEMA = {
    "type": "object",
    "properties": {
        "sessionKey": {"type": "string", "description": "the session"},
        "limit": {"type": ["integer", "null"], "minimum": 1},
        "kinds": {"type": "array", "items": {"enum": ["main", "group"]}},
    },
    "required": ["sessionKey"],
    "additionalProperties": False,
}

BODIES: list[dict[str, Any]] = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False},
    {  # every message kind, content parts, tools, and arguments left out
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                    {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
                    {"type": "file", "file": {"file_data": "AA==", "filename": "a.pdf"}},
                ],
                "name": "alice",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "sessions_list", "arguments": '{"limit": 5}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"sessions": []}'},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "sessions_list", "parameters": SCHEMA, "strict": True},
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "max_completion_tokens": 100,
        "temperature": 0.2,
        "stop": ["\n\n"],
        "logit_bias": {"50256": -100},
        "metadata": {"run": "r1"},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": SCHEMA, "strict": True},
        },
        "stream": False,
        "top_p": NOT_GIVEN,
        "seed": omit,
        "user": NOT_GIVEN,
        "prediction": omit,
    },
]


def sdk(body: dict[str, Any], expected: Any = NON_STREAMING) -> Any:
    return asyncio.run(async_maybe_transform(body, expected))


def shortcut(body: dict[str, Any], expected: Any = NON_STREAMING) -> Any:
    async def original(data: Any, expected_type: Any) -> Any:
        raise AssertionError("the shortcut should have answered")

    return asyncio.run(openai_body.shortcut(original)(body, expected))


def test_the_sdk_declares_no_alias_or_format_for_chat_completions() -> None:
    # If an SDK release adds one, the shortcut switches itself off; this says it is on.
    assert openai_body._shortcut_types() == frozenset({NON_STREAMING, STREAMING})


@pytest.mark.parametrize("body", BODIES, ids=["minimal", "everything"])
def test_plain_bodies_come_out_as_the_sdk_makes_them(body: dict[str, Any]) -> None:
    assert shortcut(body) == sdk(body)
    streaming = {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert shortcut(streaming, STREAMING) == sdk(streaming, STREAMING)


def test_omitted_arguments_are_dropped_and_none_is_kept() -> None:
    body = {"model": "m", "messages": [], "top_p": NOT_GIVEN, "seed": omit, "user": None}
    assert shortcut(body) == {"model": "m", "messages": [], "user": None}


@pytest.mark.parametrize(
    "odd",
    [
        ({"role": "user", "content": "tuple"},),  # a tuple: the SDK turns it into a list
        [{"role": "user", "content": "x", "name": NOT_GIVEN}],  # omitted below the top
        [{"role": "user", "content": b"bytes"}],
        [{1: "non-string key"}],
    ],
)
def test_anything_but_plain_json_is_left_to_the_sdk(odd: Any) -> None:
    body = {"model": "m", "messages": odd}
    assert openai_body.plain_body(body, NON_STREAMING) is None
    calls: list[Any] = []

    async def original(data: Any, expected_type: Any) -> Any:
        calls.append(data)
        return await async_maybe_transform(data, expected_type)

    out: Any = asyncio.run(openai_body.shortcut(original)(body, NON_STREAMING))
    assert calls == [body]
    assert out == sdk(body)


def test_other_request_types_are_left_to_the_sdk() -> None:
    class Other(TypedDict):
        name: str

    assert openai_body.plain_body({"name": "x"}, Other) is None


class _Leaf(TypedDict):
    when: Annotated[str, PropertyInfo(format="iso8601")]


class _Inner(TypedDict):
    leaves: list[_Leaf | None]


class _Outer(TypedDict):
    inner: dict[str, _Inner]


class _Aliased(TypedDict):
    account: Annotated[str, PropertyInfo(alias="accountName")]


class _Discriminated(TypedDict):
    kind: Annotated[str, PropertyInfo(discriminator="type")]
    values: list[dict[str, int | None]]


def test_a_declared_alias_or_format_anywhere_is_found() -> None:
    assert openai_body.declares_transforms(_Outer)  # a format three levels down
    assert openai_body.declares_transforms(_Aliased)
    assert not openai_body.declares_transforms(_Discriminated)


@pytest.fixture
def sdk_transform(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The SDK chat-completions module's names, restored (and the shortcut forgotten)
    after the test."""
    from openai.resources.chat.completions import completions as module

    names = vars(module)
    original = names["async_maybe_transform"]
    original = getattr(original, "__wrapped__", original)  # installed by an earlier test
    monkeypatch.setitem(names, "async_maybe_transform", original)
    monkeypatch.setattr(openai_body, "_installed", False)
    return names


def test_with_the_fast_paths_off_the_sdk_is_left_unpatched(sdk_transform: dict[str, Any]) -> None:
    """`install` with SWITCHBOARD_FAST_PATHS off does nothing: the SDK keeps its transform."""
    from switchboard.shared.config import Settings

    before = sdk_transform["async_maybe_transform"]
    assert openai_body.install(Settings(fast_paths=False)) is False
    assert sdk_transform["async_maybe_transform"] is before


def test_with_the_fast_paths_on_the_shortcut_is_installed_once(
    sdk_transform: dict[str, Any],
) -> None:
    """`install` with the fast paths on puts the shortcut in front of the SDK's transform,
    and a second install leaves it as it is (no shortcut over the shortcut)."""
    from switchboard.shared.config import Settings

    before = sdk_transform["async_maybe_transform"]
    assert openai_body.install(Settings(fast_paths=True)) is True
    installed = sdk_transform["async_maybe_transform"]
    assert installed is not before and installed.__wrapped__ is before
    assert openai_body.install(Settings(fast_paths=True)) is True
    assert sdk_transform["async_maybe_transform"] is installed


@pytest.mark.parametrize("fast_paths", [False, True], ids=["plain", "fast-paths"])
def test_building_an_openai_model_installs_the_shortcut_only_with_the_fast_paths_on(
    sdk_transform: dict[str, Any], fast_paths: bool
) -> None:
    """The first OpenAI model built with the fast paths on puts the shortcut in place; off,
    the SDK keeps its own transform."""
    from switchboard.shared.config import ProviderConfig
    from switchboard.shared.runtime.models import clear_model_cache, resolve_model

    clear_model_cache()
    before = sdk_transform["async_maybe_transform"]
    providers = {
        "local": ProviderConfig(base_url="http://127.0.0.1:9/v1", api="openai-completions")
    }
    resolve_model("local/m", providers, env={}, fast_paths=fast_paths)
    patched = sdk_transform["async_maybe_transform"] is not before
    assert patched is fast_paths
    clear_model_cache()


def test_a_worker_starting_leaves_the_openai_sdk_unimported() -> None:
    """The worker's startup hook imports none of the OpenAI SDK's request machinery: a
    worker whose runs never call an OpenAI API does not pay its memory."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from switchboard.shared.config import Settings\n"
        "from switchboard.workers.tasks import _install_fast_paths\n"
        "_install_fast_paths(Settings(fast_paths=True))\n"
        "print('openai.resources.chat.completions.completions' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the answer: a chat completion parsed in one step ----------------------------------

COMPLETIONS: list[dict[str, Any]] = [
    {  # a text answer, as the fake model server gives it
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "done"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    },
    {  # tool calls, nulls, usage details, and extra fields at several depths
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1_700_000_001,
        "model": "gpt-x",
        "system_fingerprint": None,
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "reasoning_content": "thinking",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "sessions_list", "arguments": '{"limit": 5}'},
                        },
                        {"id": "call_2", "type": "custom", "custom": {"name": "x", "input": "y"}},
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": None},
            "completion_tokens_details": {"reasoning_tokens": 1},
            "cost": 0.5,
        },
        "provider": {"name": "somewhere", "regions": ["a", "b"]},
    },
]


def _sdk_completion(data: dict[str, Any]) -> Any:
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion

    return construct_type(type_=ChatCompletion, value=data)


def _shape(value: Any) -> Any:
    """Everything a model holds, recursively: class, fields, extra fields, the declared
    fields set (the SDK's construct counts extra fields as set at some depths, not others:
    they are dumped either way)."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        declared = type(value).model_fields
        return (
            type(value),
            {name: _shape(getattr(value, name)) for name in declared},
            value.model_extra,
            value.model_fields_set & set(declared),
        )
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return (type(value), value)


@pytest.mark.parametrize("data", COMPLETIONS)
def test_completions_come_out_as_the_sdk_builds_them(data: dict[str, Any]) -> None:
    from openai.types.chat import ChatCompletion

    parsed = openai_body.parsed_completion(data, ChatCompletion)
    assert parsed is not None
    assert _shape(parsed) == _shape(_sdk_completion(data))
    sdk = _sdk_completion(data)
    assert parsed.model_dump() == sdk.model_dump()
    assert parsed.to_dict() == sdk.to_dict()  # the unset fields left out alike
    assert parsed.to_json() == sdk.to_json()


@pytest.mark.parametrize(
    "change",
    [
        {"created": "1700000000"},  # a number as a string: the SDK keeps it as it is
        {"created": 1.5},
        {"object": "chat.completion.chunk"},
        {"choices": [{"index": 0, "message": {"role": "assistant"}, "finish_reason": "eos"}]},
        {"choices": "none"},
        {"id": None},
    ],
)
def test_anything_but_exactly_typed_completions_is_left_to_the_sdk(change: dict[str, Any]) -> None:
    from openai.types.chat import ChatCompletion

    assert openai_body.parsed_completion({**COMPLETIONS[0], **change}, ChatCompletion) is None


def test_other_response_types_are_left_to_the_sdk() -> None:
    from openai.types import Model

    assert openai_body.parsed_completion(COMPLETIONS[0], Model) is None
    assert openai_body.parsed_completion([COMPLETIONS[0]], object) is None


def test_an_async_client_parses_completions_through_the_shortcut_unless_strict(
    sdk_transform: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed, an async client's answer goes through `parsed_completion`; a client with
    strict response validation keeps the SDK's own; the same completion either way."""
    import httpx2
    from openai import AsyncOpenAI
    from openai._base_client import AsyncAPIClient
    from openai.types.chat import ChatCompletion

    sdk = AsyncAPIClient._process_response_data
    sdk = getattr(sdk, "__wrapped__", sdk)
    monkeypatch.setattr(AsyncAPIClient, "_process_response_data", sdk)
    openai_body.install_shortcut()
    assert AsyncAPIClient._process_response_data is not sdk
    calls: list[Any] = []
    real = openai_body.parsed_completion
    monkeypatch.setattr(
        openai_body, "parsed_completion", lambda d, t: calls.append(t) or real(d, t)
    )
    response = httpx2.Response(200, request=httpx2.Request("POST", "http://x/v1"))
    for strict in (False, True):
        client = AsyncOpenAI(
            api_key="k", base_url="http://x/v1", _strict_response_validation=strict
        )
        got = client._process_response_data(
            data=COMPLETIONS[1], cast_to=ChatCompletion, response=response
        )
        assert _shape(got) == _shape(_sdk_completion(COMPLETIONS[1])) or strict
        assert isinstance(got, ChatCompletion)
    assert calls == [ChatCompletion]  # the strict client never asked
    openai_body.install_shortcut()  # once: no shortcut over the shortcut
    assert AsyncAPIClient._process_response_data.__wrapped__ is sdk  # type: ignore[attr-defined]
