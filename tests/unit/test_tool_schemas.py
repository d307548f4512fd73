"""Tool schemas fitted once per tool set: the same request parameters as pydantic-ai's own
fitting, for less work (`runtime.tool_schemas`, a fast path)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic_ai import models as pai_models
from pydantic_ai.messages import InstructionPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition

from switchboard.shared.config import ProviderConfig
from switchboard.shared.runtime import models, tool_schemas

pytestmark = pytest.mark.unit

SCHEMA = {
    "type": "object",
    "properties": {
        "sessionKey": {"type": "string", "description": "the session"},
        "limit": {"type": ["integer", "null"], "minimum": 1},
        "kinds": {"type": "array", "items": {"enum": ["main", "group"]}},
        "filter": {"$ref": "#/$defs/Filter"},
    },
    "required": ["sessionKey"],
    "$defs": {"Filter": {"type": "object", "properties": {"q": {"type": "string"}}}},
}


def _tools() -> list[ToolDefinition]:
    return [
        ToolDefinition(name="sessions_list", description="list", parameters_json_schema=SCHEMA),
        ToolDefinition(
            name="strict_one",
            description="strict",
            parameters_json_schema={
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            strict=True,
        ),
    ]


def _model(cls: type[Any]) -> Any:
    provider = OpenAIProvider(api_key="unused", base_url="http://127.0.0.1:9/v1")
    return cls("gpt-4o", provider=provider)


def _per_request(params: ModelRequestParameters, n: int) -> ModelRequestParameters:
    """What pydantic-ai's direct API hands the model: a copy carrying the instructions."""
    return replace(params, instruction_parts=[InstructionPart(content=f"request {n}")])


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tools pydantic-ai fits, one entry per fitting."""
    fitted: list[str] = []
    original = pai_models._customize_tool_def

    def counting(transformer: Any, tool_def: ToolDefinition) -> ToolDefinition:
        fitted.append(tool_def.name)
        return original(transformer, tool_def)

    monkeypatch.setattr(pai_models, "_customize_tool_def", counting)
    return fitted


@pytest.mark.parametrize("base", [OpenAIChatModel, OpenAIResponsesModel])
def test_the_fitted_parameters_are_pydantic_ais_own(base: type[Any]) -> None:
    params = ModelRequestParameters(function_tools=_tools(), allow_text_output=True)
    plain = _model(base)
    fitted = _model(tool_schemas.fitted_once(base))
    assert isinstance(fitted, base)

    for n in range(3):  # the first request fits, the others reuse
        mine = fitted.prepare_request(None, _per_request(params, n))[1]
        theirs = plain.prepare_request(None, _per_request(params, n))[1]
        assert mine == theirs
        assert mine.instruction_parts == [InstructionPart(content=f"request {n}")]
    # The fitting did change the schemas (strictness inferred, `$ref` inlined or kept as
    # the profile wants), so the comparison above compared fitted schemas.
    assert theirs.function_tools != params.function_tools


def test_a_tool_set_is_fitted_once_across_requests_and_anew_when_it_changes(
    fits: list[str],
) -> None:
    params = ModelRequestParameters(function_tools=_tools(), allow_text_output=True)
    model = _model(tool_schemas.fitted_once(OpenAIChatModel))

    for n in range(5):
        model.prepare_request(None, _per_request(params, n))
    assert fits == ["sessions_list", "strict_one"]

    other = ModelRequestParameters(function_tools=_tools()[:1], allow_text_output=True)
    model.prepare_request(None, other)
    assert fits == ["sessions_list", "strict_one", "sessions_list"]


def test_pydantic_ais_model_fits_every_request(fits: list[str]) -> None:
    """The plain path, for contrast: what the fast path saves."""
    params = ModelRequestParameters(function_tools=_tools(), allow_text_output=True)
    model = _model(OpenAIChatModel)
    for n in range(3):
        model.prepare_request(None, _per_request(params, n))
    assert len(fits) == 6


def test_a_fitting_that_changes_more_than_the_tools_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0

    def also_sets_text_output(self: Any, params: ModelRequestParameters) -> ModelRequestParameters:
        nonlocal calls
        calls += 1
        return replace(params, allow_text_output=False)

    monkeypatch.setattr(OpenAIChatModel, "customize_request_parameters", also_sets_text_output)
    params = ModelRequestParameters(function_tools=_tools(), allow_text_output=True)
    model = _model(tool_schemas.fitted_once(OpenAIChatModel))
    for _ in range(3):
        out = model.customize_request_parameters(params)
        assert out.allow_text_output is False
    assert calls == 3


def test_the_remembered_tool_sets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool_schemas, "FITTED_MAX", 3)
    model = _model(tool_schemas.fitted_once(OpenAIChatModel))
    for _ in range(10):
        model.customize_request_parameters(ModelRequestParameters(function_tools=_tools()))
    assert len(model._fitted) == 3


def test_resolve_model_mixes_it_in_only_with_the_fast_paths_on() -> None:
    providers = {"fake": ProviderConfig(base_url="http://127.0.0.1:9/v1", api_key="k")}
    models.clear_model_cache()
    try:
        fast = models.resolve_model("fake/m", providers, fast_paths=True)
        models.clear_model_cache()
        plain = models.resolve_model("fake/m", providers, fast_paths=False)
    finally:
        models.clear_model_cache()
    assert isinstance(fast, tool_schemas.FittedOnce)
    assert isinstance(fast, OpenAIChatModel)
    assert not isinstance(plain, tool_schemas.FittedOnce)
    assert type(plain) is OpenAIChatModel
