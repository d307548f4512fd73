"""Fast path: a model's tool schemas fitted to its provider once per tool set, not per request.

Before every request, pydantic-ai fits each tool's JSON schema to the provider
(`Model.customize_request_parameters`: the profile's schema transformer copies the schema
deeply, walks it and checks its shape for strict mode). A run's tools are the same request
after request, and the same from run to run: the worker builds their request parameters
once per tool set and hands the same object to every request (`agent_loop._toolbox`).
With six tools that fitting was about a quarter of the CPU a request to an
OpenAI-compatible server costs the worker (pydantic-ai, the SDK and its HTTP client
together), and a fan-out's worker makes one or more such requests per child.

`FittedOnce` keeps what that method made of the tools it was given, by the identity of the
tool lists (and output object) in the parameters: pydantic-ai's direct API copies the
parameters for each request (adding its instructions) but keeps those lists, which nothing
writes to once built. A request with the same tools reuses the fitted schemas; tools built
anew (another tool set, a caller that builds them per request) are fitted as before. The
method changes only those three fields (checked on each first fit: where it changes more,
nothing is kept), so the request sent is the same either way.

Mixed into the models `models.resolve_model` builds, only with the fast paths on
(``Settings.fast_paths``); off, the models are pydantic-ai's own classes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from pydantic_ai.models import ModelRequestParameters

# Tool sets remembered per model (a worker's are few: one per agent configuration).
FITTED_MAX = 64


class FittedOnce:
    """Mixin for a pydantic-ai `Model`: `customize_request_parameters` fits each tool set
    once (see the module's docstring)."""

    _fitted: OrderedDict[tuple[int, int, int], tuple[_Tools, _Tools]]
    _fitted_lock: threading.Lock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fitted = OrderedDict()
        self._fitted_lock = threading.Lock()

    def customize_request_parameters(
        self, model_request_parameters: ModelRequestParameters
    ) -> ModelRequestParameters:
        params = model_request_parameters
        tools = _tools_of(params)
        key = (id(tools[0]), id(tools[1]), id(tools[2]))
        with self._fitted_lock:
            hit = self._fitted.get(key)
            if hit is not None and all(a is b for a, b in zip(hit[0], tools, strict=True)):
                self._fitted.move_to_end(key)
                return _with_tools(params, hit[1])
        fitted: ModelRequestParameters = super().customize_request_parameters(  # type: ignore[misc]
            params
        )
        fitted_tools = _tools_of(fitted)
        if _with_tools(params, fitted_tools) != fitted:
            return fitted  # it changed more than the tools: fitted anew each time
        with self._fitted_lock:
            # The inputs are kept with their answer: their ids are not reused meanwhile.
            self._fitted[key] = (tools, fitted_tools)
            self._fitted.move_to_end(key)
            while len(self._fitted) > FITTED_MAX:
                self._fitted.popitem(last=False)
        return fitted


# The fields `customize_request_parameters` fits: function tools, output tools, output object.
_Tools = tuple[Any, Any, Any]


def _tools_of(params: ModelRequestParameters) -> _Tools:
    return (params.function_tools, params.output_tools, params.output_object)


def _with_tools(params: ModelRequestParameters, tools: _Tools) -> ModelRequestParameters:
    function_tools, output_tools, output_object = tools
    if all(a is b for a, b in zip(_tools_of(params), tools, strict=True)):
        return params
    return replace(
        params,
        function_tools=function_tools,
        output_tools=output_tools,
        output_object=output_object,
    )


def fitted_once(model_class: type[Any]) -> type[Any]:
    """``model_class`` with `FittedOnce` mixed in (one subclass per class, made once)."""
    with _classes_lock:
        made = _classes.get(model_class)
        if made is None:
            made = _classes[model_class] = type(
                model_class.__name__, (FittedOnce, model_class), {"__module__": __name__}
            )
        return made


_classes: dict[type[Any], type[Any]] = {}
_classes_lock = threading.Lock()
