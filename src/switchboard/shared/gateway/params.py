"""Validated parameters of the gateway methods (`POST /rpc`), one model per method.

Wrong types, missing fields and out-of-range numbers are rejected here with the field
named, before anything is read or written. Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from switchboard.shared.errors import InvalidInput

# The longest message (and other free text) a method takes, in characters.
MAX_MESSAGE_CHARS = 1_000_000
Text = Annotated[StrictStr, Field(max_length=MAX_MESSAGE_CHARS)]
ShortText = Annotated[StrictStr, Field(max_length=512)]
Count = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]


class _Params(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AgentParams(_Params):
    """`agent`: start a run in a session."""

    sessionKey: ShortText | None = None
    message: Text
    agentId: ShortText | None = None
    channel: ShortText | None = None
    to: ShortText | None = None
    accountId: ShortText | None = None
    threadId: ShortText | int | None = None
    deliver: StrictBool = False
    idempotencyKey: ShortText | None = None
    extraSystemPrompt: Text | None = None
    label: ShortText | None = None
    timeout: Annotated[float, Field(strict=True, ge=0, le=3600)] | None = None


class AgentWaitParams(_Params):
    """`agent.wait`: wait for a run's outcome."""

    runId: ShortText
    timeoutMs: Annotated[int, Field(strict=True, ge=0, le=600_000)] | None = None


class ChatSendParams(_Params):
    """`chat.send`: a webchat message into a session."""

    sessionKey: ShortText | None = None
    message: Text
    deliver: StrictBool = False
    idempotencyKey: ShortText | None = None


class ChatHistoryParams(_Params):
    """`chat.history`: the last messages of a session."""

    sessionKey: ShortText | None = None
    limit: Annotated[int, Field(strict=True, ge=1, le=1000)] | None = None


class SessionsListParams(_Params):
    """`sessions.list`: sessions newest first."""

    limit: Count | None = None
    activeMinutes: Count | None = None
    includeGlobal: StrictBool = False
    includeUnknown: StrictBool = False
    label: ShortText | None = None
    spawnedBy: ShortText | None = None
    agentId: ShortText | None = None
    search: ShortText | None = None
    kinds: list[Literal["main", "group", "cron", "hook", "node", "other"]] | None = None


class SessionsResolveParams(_Params):
    """`sessions.resolve`: one of key, sessionId, label."""

    key: ShortText | None = None
    sessionId: ShortText | None = None
    label: ShortText | None = None
    agentId: ShortText | None = None


class SessionsPatchParams(_Params):
    """`sessions.patch`: per-session fields (null clears)."""

    key: ShortText
    label: ShortText | None = None
    displayName: ShortText | None = None
    thinkingLevel: ShortText | None = None
    verboseLevel: ShortText | None = None
    sendPolicy: Literal["allow", "deny"] | None = None
    model: ShortText | None = None


class SessionsDeleteParams(_Params):
    """`sessions.delete`: remove a session."""

    key: ShortText
    deleteTranscript: StrictBool = True


class FlowsGetParams(_Params):
    """`flows.get`: one reply-back flow (rounds, announce, delivery outcome)."""

    flowId: ShortText


class FlowsListParams(_Params):
    """`flows.list`: the newest reply-back flows a session requested or was sent."""

    sessionKey: ShortText | None = None
    limit: Annotated[int, Field(strict=True, ge=1, le=200)] | None = None


class DeliveriesListParams(_Params):
    """`deliveries.list`: recent deliveries concerning a session, newest first."""

    sessionKey: ShortText | None = None
    limit: Annotated[int, Field(strict=True, ge=1, le=200)] | None = None


def parse_params(model: type[_Params], raw: Any) -> dict[str, Any]:
    """Validate raw params; only the fields the caller actually set are returned."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput("params must be an object", field="params")
    try:
        parsed = model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(exc), field=_first_field(exc)) from None
    return parsed.model_dump(exclude_unset=True)


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per problem, naming the field."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"]) or "params"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid params: " + "; ".join(parts)


def _first_field(exc: ValidationError) -> str:
    errs = exc.errors(include_url=False, include_input=False)
    return ".".join(str(p) for p in errs[0]["loc"]) if errs else "params"
