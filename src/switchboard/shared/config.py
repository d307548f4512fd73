"""The JSON5 config in OpenClaw's shape and the infrastructure settings from the environment.

Both are built by cached getters (`get_config`, `get_settings`), never at import time.
Config sections accept OpenClaw's camelCase keys (and the snake_case attribute names); a
bad value raises `ConfigError` naming the dotted key path, an unknown key only warns: a
record of the `switchboard.config` logger naming the key (and the declared key it is closest
to, if any).
"""

from __future__ import annotations

import builtins
import difflib
import functools
import json
import logging
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import urlsplit

import json5
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

from switchboard.shared.errors import InvalidInput

BUILTIN_MODEL = "builtin/echo"  # the offline model used when nothing else is configured
DEFAULT_AGENT_ID = "main"
DEFAULT_MAIN_KEY = "main"
_AGENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$", re.IGNORECASE)
# Values under these keys never appear in error messages.
_SECRET_KEY_RE = re.compile(r"(apikey|api_key|token|secret|password)$", re.IGNORECASE)
_JSON5_ERROR_RE = re.compile(r"^<string>:(\d+) (.*) at column (\d+)$")
_VISIBILITIES = ("self", "tree", "agent", "all")
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number"}


class ConfigError(InvalidInput):
    """The config file or the environment holds something Switchboard cannot use."""

    def __init__(self, message: str, *, key_path: str | None = None, **fields: Any) -> None:
        super().__init__(message, key_path=key_path, **fields)
        self.key_path = key_path


# Config warnings (unknown keys) are log lines of their own logger, one per key.
_log = logging.getLogger("switchboard.config")


def _warn(message: str) -> None:
    """Log a config warning (an unknown key)."""
    _log.warning(message)


# --- value checks (messages name the constraint; the caller adds the key path) ------------


def _between(lo: int, hi: int) -> AfterValidator:
    """A check that an integer lies in lo..hi inclusive."""

    def check(value: int) -> int:
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}")
        return value

    return AfterValidator(check)


def _at_least(lo: int) -> AfterValidator:
    """A check that an integer is at least lo."""

    def check(value: int) -> int:
        if value < lo:
            raise ValueError(f"must be >= {lo}")
        return value

    return AfterValidator(check)


def _positive() -> AfterValidator:
    """A check that a number is finite and greater than zero."""

    def check(value: float) -> float:
        if not (math.isfinite(value) and value > 0):
            raise ValueError("must be a finite number > 0")
        return value

    return AfterValidator(check)


def _http_url(value: str) -> str:
    """Accept an absolute http(s) URL, kept as written."""
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - property access validates the port
    except ValueError:
        raise ValueError("must be an http(s) URL with a valid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL")
    return value


def _model_shape(value: object) -> object:
    """Accept OpenClaw's two model shapes: "provider/model" or {primary, fallbacks}."""
    if isinstance(value, str):
        return {"primary": value}
    if value is None or isinstance(value, Mapping | BaseModel):
        return value
    raise ValueError('must be "provider/model" or {primary, fallbacks}')


def _primary_of(value: object) -> object:
    """Reduce either model shape to its primary "provider/model" string."""
    if isinstance(value, Mapping):
        value = value.get("primary")
    return value.strip() or None if isinstance(value, str) else value


# --- config sections ----------------------------------------------------------------------


class _Section(BaseModel):
    """Base of the config sections: camelCase keys, strict types, unknown keys kept to warn."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        strict=True,
        frozen=True,
    )
    warn_unknown_keys: ClassVar[bool] = True


class ModelRef(_Section):
    """A model setting: the primary `provider/model` and its fallbacks."""

    primary: str | None = None
    fallbacks: list[str] = []

    @field_validator("primary", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        return value.strip() or None if isinstance(value, str) else value


ModelSetting = Annotated[ModelRef | None, BeforeValidator(_model_shape)]
PrimaryModel = Annotated[str | None, BeforeValidator(_primary_of)]
HttpUrlStr = Annotated[str, AfterValidator(_http_url)]


class SendPolicyMatch(_Section):
    """The criteria of one send-policy rule; every present criterion must match."""

    channel: str | None = None
    chat_type: Literal["direct", "group", "channel", "dm"] | None = None
    key_prefix: str | None = None
    raw_key_prefix: str | None = None


class SendPolicyRule(_Section):
    """One send-policy rule: an action for the sessions its match selects."""

    action: Literal["allow", "deny"] = "allow"
    match: SendPolicyMatch | None = None


class SendPolicyConfig(_Section):
    """`session.sendPolicy`: ordered rules, first matching deny wins, else default."""

    default: Literal["allow", "deny"] = "allow"
    rules: list[SendPolicyRule] = []


class SessionAgentToAgent(_Section):
    """`session.agentToAgent`: limits of the reply-back loop."""

    max_ping_pong_turns: Annotated[int, _between(0, 5)] = 5


class SessionConfig(_Section):
    """`session.*`: main key, scope and send policy."""

    main_key: str = DEFAULT_MAIN_KEY
    scope: Literal["per-sender", "global"] = "per-sender"
    send_policy: SendPolicyConfig | None = None
    agent_to_agent: SessionAgentToAgent = Field(default_factory=SessionAgentToAgent)

    @field_validator("main_key", mode="before")
    @classmethod
    def _normalise_main_key(cls, value: object) -> object:
        if value is None:
            return DEFAULT_MAIN_KEY
        return value.strip().lower() or DEFAULT_MAIN_KEY if isinstance(value, str) else value


class SessionsToolConfig(_Section):
    """`tools.sessions`: which sessions the session tools may see."""

    # OpenClaw's default since PR #133469 (was "tree"): every session of the caller's agent.
    visibility: Literal["self", "tree", "agent", "all"] = "agent"

    @field_validator("visibility", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        # Read case-insensitively, as OpenClaw does. OpenClaw falls back to "agent" on any
        # other value; here another value is an error, so a typo cannot widen or narrow
        # what the tools see without anyone noticing.
        if isinstance(value, str) and value.strip().lower() in _VISIBILITIES:
            return value.strip().lower()
        return value


class AgentToAgentConfig(_Section):
    """`tools.agentToAgent`: cross-agent access switch and allow list (ids or globs)."""

    enabled: bool = False
    allow: list[str] = []


class ToolPolicy(_Section):
    """Tool names to allow, re-allow and deny."""

    allow: list[str] = []
    also_allow: list[str] = []
    deny: list[str] = []


class SubagentToolsConfig(_Section):
    """`tools.subagents`: the tool policy of sub-agent sessions."""

    tools: ToolPolicy = Field(default_factory=ToolPolicy)


class SwarmConfig(_Section):
    """`tools.swarm`: collector children (`sessions_spawn` `collect`) and `agents_wait`.

    OpenClaw's keys, bounds and caps; OpenClaw ships the feature off (experimental),
    Switchboard on (`enabled: false` refuses the collector parameters with OpenClaw's
    message and offers no `agents_wait`)."""

    enabled: bool = True
    # Collector children of one group (per requester; `groupId`, else the requester's
    # ungrouped collectors) not yet completed, and spawned over the group's life.
    max_children_per_group: Annotated[int, _between(1, 10_000)] = 50
    max_total_per_group: Annotated[int, _between(1, 100_000)] = 200
    # The most an `agents_wait` may wait (its `timeoutSeconds` is clamped to it).
    wait_timeout_seconds_max: Annotated[int, _between(1, 86_400)] = 600


class ToolsConfig(_Section):
    """`tools.*`: session-tool visibility, agent-to-agent policy, sub-agent tools, and the
    allow/deny globs every run's tools pass (session, MCP and Python tools alike)."""

    allow: list[str] = []
    also_allow: list[str] = []
    deny: list[str] = []
    sessions: SessionsToolConfig = Field(default_factory=SessionsToolConfig)
    agent_to_agent: AgentToAgentConfig = Field(default_factory=AgentToAgentConfig)
    subagents: SubagentToolsConfig = Field(default_factory=SubagentToolsConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)


class SandboxConfig(_Section):
    """`sandbox`: which sessions are sandboxed and how far they may see."""

    mode: Literal["off", "non-main", "all"] = "off"
    session_tools_visibility: Literal["spawned", "all"] = "spawned"


class SubagentDefaults(_Section):
    """`agents.defaults.subagents`: spawn limits and defaults."""

    run_timeout_seconds: Annotated[int, _at_least(0)] = 0
    max_spawn_depth: Annotated[int, _between(1, 5)] = 1
    # OpenClaw caps this at 20; large batch fan-outs raise it (up to 10,000).
    max_children_per_agent: Annotated[int, _between(1, 10_000)] = 5
    archive_after_minutes: Annotated[int, _at_least(0)] = 60
    allow_agents: list[str] = []
    model: PrimaryModel = None
    thinking: str | None = None
    announce_timeout_ms: Annotated[int, _between(1, 2_147_000_000)] = 120_000
    require_agent_id: bool = False


class AgentDefaults(_Section):
    """`agents.defaults`: what every agent gets unless its entry overrides it."""

    model: ModelSetting = None
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    subagents: SubagentDefaults = Field(default_factory=SubagentDefaults)
    user_timezone: str = "UTC"
    system_prompt: str | None = None

    @property
    def model_ref(self) -> str | None:
        """The primary `provider/model`, if one is configured."""
        return self.model.primary if self.model else None


class AgentSubagents(_Section):
    """`agents.list[].subagents`: per-agent overrides of the sub-agent defaults."""

    allow_agents: list[str] | None = None
    model: PrimaryModel = None
    thinking: str | None = None
    require_agent_id: bool | None = None


class AgentEntry(_Section):
    """One `agents.list[]` entry."""

    id: str
    name: str | None = None
    default: bool = False
    model: ModelSetting = None
    sandbox: SandboxConfig | None = None
    subagents: AgentSubagents | None = None
    system_prompt: str | None = None
    # The agent's own tool allow/deny globs, applied after `tools.allow|deny`.
    tools: ToolPolicy | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _strip_id(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not _AGENT_ID_RE.match(value):
            raise ValueError("must match [a-z0-9][a-z0-9_-]{0,63}")
        return value.lower()

    @property
    def model_ref(self) -> str | None:
        """The agent's own primary `provider/model`, if it sets one."""
        return self.model.primary if self.model else None


class AgentsConfig(_Section):
    """`agents.*`: the defaults and the configured agents."""

    defaults: AgentDefaults = Field(default_factory=AgentDefaults)
    list: builtins.list[AgentEntry] = []


class ProviderModel(_Section):
    """One model a provider offers."""

    id: str
    name: str | None = None


class ProviderConfig(_Section):
    """`models.providers.<name>`: where and how to reach a model provider."""

    base_url: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    api: str | None = None
    models: list[ProviderModel] = []


class ModelsConfig(_Section):
    """`models.*`: the configured providers."""

    providers: dict[str, ProviderConfig] = {}


class WebhookConfig(_Section):
    """`channels.<name>.webhook`: the outbound webhook that bridges a chat platform."""

    url: HttpUrlStr
    headers: dict[str, str] = Field(default={}, repr=False)


class ChannelConfig(_Section):
    """`channels.<name>`: only the webhook is read; platform keys are kept silently."""

    warn_unknown_keys: ClassVar[bool] = False
    webhook: WebhookConfig | None = None


class GatewayAuth(_Section):
    """`gateway.auth`: the bearer token clients present."""

    token: str | None = Field(default=None, repr=False)
    mode: str | None = None


class GatewayConfig(_Section):
    """`gateway.*`: the parts Switchboard reads."""

    auth: GatewayAuth = Field(default_factory=GatewayAuth)


class RunsConfig(_Section):
    """`runs.*` (Switchboard's own): retention, default deadline and retries of agent runs."""

    retention_hours: Annotated[float, _positive()] = 24.0
    # Capped at an hour: the broker's visibility timeout (2 h) and the worker's grace
    # period (deploy/) are sized above the longest step.
    timeout_seconds: Annotated[int, _between(1, 3600)] = 600
    max_attempts: Annotated[int, _between(1, 20)] = 3


class DeliveryConfig(_Section):
    """`delivery.*` (Switchboard's own): retries and timeouts of outbound deliveries."""

    max_attempts: Annotated[int, _between(1, 100)] = 5
    backoff_base_s: Annotated[float, _positive()] = 1.0
    backoff_max_s: Annotated[float, _positive()] = 60.0
    timeout_s: Annotated[float, _positive()] = 10.0


class McpToolFilter(_Section):
    """`mcp.servers.<name>.toolFilter`: the server's tools offered (globs, its own names)."""

    include: list[str] = []
    exclude: list[str] = []


McpTransport = Literal["stdio", "sse", "streamable-http"]


class McpServerConfig(_Section):
    """`mcp.servers.<name>`: an MCP server whose tools agent runs get (OpenClaw's shape).

    stdio: `command`, `args`, `env`, `cwd`; HTTP: `url`, `transport`, `headers` (a `url`
    without `transport` is SSE, as in OpenClaw). `maxConcurrent` (beyond OpenClaw) caps
    the calls in flight to the server across the fleet."""

    enabled: bool = True
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = Field(default={}, repr=False)
    cwd: str | None = None
    url: HttpUrlStr | None = None
    transport: McpTransport | None = None
    headers: dict[str, str] = Field(default={}, repr=False)
    connection_timeout_ms: Annotated[int, _between(1, 600_000)] = 30_000
    request_timeout_ms: Annotated[int, _between(1, 3_600_000)] = 60_000
    tool_filter: McpToolFilter = Field(default_factory=McpToolFilter)
    max_concurrent: Annotated[int, _between(1, 100_000)] | None = None
    # OpenClaw keys read and kept (not acted on here).
    supports_parallel_tool_calls: bool | None = None
    ssl_verify: bool | None = None

    @model_validator(mode="after")
    def _reachable(self) -> Self:
        kind = self.kind
        if kind == "stdio" and not (self.command or "").strip():
            raise ValueError("a stdio server needs a `command`")
        if kind != "stdio" and not self.url:
            raise ValueError(f"a {kind} server needs a `url`")
        return self

    @property
    def kind(self) -> McpTransport:
        """How the server is reached: the `transport`, else stdio with a `command`, else SSE."""
        if self.transport is not None:
            return self.transport
        return "sse" if self.url and not self.command else "stdio"


class McpConfig(_Section):
    """`mcp.*`: the MCP servers agent runs get tools from."""

    servers: dict[str, McpServerConfig] = {}


@dataclass(frozen=True)
class EffectiveSubagents:
    """An agent's sub-agent settings with its overrides merged over the defaults."""

    allow_agents: tuple[str, ...]
    model: str | None
    thinking: str | None
    require_agent_id: bool
    max_spawn_depth: int
    max_children_per_agent: int
    run_timeout_seconds: int
    archive_after_minutes: int
    announce_timeout_ms: int


class SwitchboardConfig(_Section):
    """The whole validated config; `{}` is valid and means all defaults."""

    session: SessionConfig = Field(default_factory=SessionConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    channels: dict[str, ChannelConfig] = {}
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    runs: RunsConfig = Field(default_factory=RunsConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)

    @model_validator(mode="wrap")
    @classmethod
    def _validate_whole(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # Every way of building the root (load_config, model_validate, the constructor)
        # reports the same ConfigError and the same unknown-key warnings.
        try:
            config = handler(data)
        except ValidationError as exc:
            raise _error([_issue_from(err) for err in exc.errors()]) from exc
        issues = list(_consistency_issues(config))
        if issues:
            raise _error(issues)
        for path, near in _unknown_keys(config, ""):
            _warn(f"unknown config key: {path}" + (f" (did you mean {near}?)" if near else ""))
        return config

    def default_agent_id(self) -> str:
        """The entry with `default: true`, else the first entry, else `main`."""
        entries = self.agents.list
        chosen = next((entry for entry in entries if entry.default), None)
        if chosen is None and entries:
            chosen = entries[0]
        return chosen.id if chosen else DEFAULT_AGENT_ID

    def agent(self, agent_id: str) -> AgentEntry | None:
        """The configured entry of an agent id (case-insensitive), if any."""
        wanted = agent_id.strip().lower()
        return next((entry for entry in self.agents.list if entry.id == wanted), None)

    def agent_ids(self) -> list[str]:
        """The configured agent ids in order; `["main"]` when none is configured."""
        return [entry.id for entry in self.agents.list] or [DEFAULT_AGENT_ID]

    def model_for(self, agent_id: str) -> str:
        """The agent's model, else the default model, else the built-in offline model."""
        entry = self.agent(agent_id)
        own = entry.model_ref if entry else None
        return own or self.agents.defaults.model_ref or BUILTIN_MODEL

    def subagent_model_for(self, agent_id: str) -> str:
        """A sub-agent's model as OpenClaw picks it (before any explicit spawn override)."""
        entry = self.agent(agent_id)
        own = entry.subagents.model if entry and entry.subagents else None
        own = own or (entry.model_ref if entry else None)
        return own or self.agents.defaults.subagents.model or self.model_for(agent_id)

    def model_refs(self) -> list[str]:
        """Every `provider/model` the config names for its agents and their sub-agents."""
        refs = {self.model_for(agent_id) for agent_id in self.agent_ids()}
        refs |= {self.subagent_model_for(agent_id) for agent_id in self.agent_ids()}
        return sorted(refs)

    def sandbox_for(self, agent_id: str) -> SandboxConfig:
        """The agent's sandbox settings: keys it sets itself, the defaults for the rest."""
        defaults = self.agents.defaults.sandbox
        entry = self.agent(agent_id)
        if entry is None or entry.sandbox is None:
            return defaults
        own = entry.sandbox.model_dump(include=set(SandboxConfig.model_fields))
        set_here = {k: v for k, v in own.items() if k in entry.sandbox.model_fields_set}
        return defaults.model_copy(update=set_here)

    def is_sandboxed(self, agent_id: str, is_main_session: bool) -> bool:
        """Whether a session of this agent runs sandboxed (`all`, or `non-main` off main)."""
        mode = self.sandbox_for(agent_id).mode
        return mode == "all" or (mode == "non-main" and not is_main_session)

    def subagents_for(self, agent_id: str) -> EffectiveSubagents:
        """The agent's sub-agent settings merged over `agents.defaults.subagents`."""
        base = self.agents.defaults.subagents
        entry = self.agent(agent_id)
        own = entry.subagents if entry and entry.subagents else AgentSubagents()
        allow = own.allow_agents if own.allow_agents is not None else base.allow_agents
        require = own.require_agent_id
        return EffectiveSubagents(
            allow_agents=tuple(name.strip().lower() for name in allow if name.strip()),
            model=own.model or base.model,
            thinking=own.thinking or base.thinking,
            require_agent_id=base.require_agent_id if require is None else require,
            max_spawn_depth=base.max_spawn_depth,
            max_children_per_agent=base.max_children_per_agent,
            run_timeout_seconds=base.run_timeout_seconds,
            archive_after_minutes=base.archive_after_minutes,
            announce_timeout_ms=base.announce_timeout_ms,
        )


# --- error reporting ----------------------------------------------------------------------

_NO_VALUE = object()


@dataclass(frozen=True)
class _Issue:
    """One bad value: where it is, what it is, what is wrong."""

    path: str
    value: object
    problem: str

    def __str__(self) -> str:
        if self.value is _NO_VALUE:
            return f"{self.path}: {self.problem}"
        return f"{self.path} = {_show(self.value, self.path)}: {self.problem}"


def _show(value: object, path: str = "") -> str:
    """A short, secret-free rendering of a bad value."""
    if _SECRET_KEY_RE.search(path.rsplit(".", 1)[-1]) or ".headers" in path.lower():
        return '"<redacted>"'
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _dotted(loc: tuple[int | str, ...]) -> str:
    """`("agents", "list", 0, "id")` → `agents.list[0].id`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "<root>"


def _issue_from(err: ErrorDetails) -> _Issue:
    """Translate one pydantic error into an issue naming the key path."""
    if err["type"] == "value_error":
        problem = str(err.get("ctx", {}).get("error", err["msg"]))
    else:
        problem = err["msg"][:1].lower() + err["msg"][1:]
    value = _NO_VALUE if err["type"] == "missing" else err["input"]
    return _Issue(_dotted(err["loc"]), value, problem)


def _error(issues: list[_Issue]) -> ConfigError:
    """One ConfigError for every issue; the first one's path is `key_path`."""
    message = "invalid config: " + "; ".join(str(issue) for issue in issues)
    return ConfigError(message, key_path=issues[0].path, issues=[str(i) for i in issues])


def _consistency_issues(config: SwitchboardConfig) -> Iterator[_Issue]:
    """Checks that span several keys."""
    seen: set[str] = set()
    for index, entry in enumerate(config.agents.list):
        if entry.id in seen:
            yield _Issue(f"agents.list[{index}].id", entry.id, "duplicate agent id")
        seen.add(entry.id)
    delivery = config.delivery
    if delivery.backoff_max_s < delivery.backoff_base_s:
        problem = f"must be >= delivery.backoffBaseS ({delivery.backoff_base_s})"
        yield _Issue("delivery.backoffMaxS", delivery.backoff_max_s, problem)


def _unknown_keys(section: BaseModel, prefix: str) -> Iterator[tuple[str, str | None]]:
    """The dotted path of each key no section declares, with the declared key nearest it."""
    fields = type(section).model_fields
    if getattr(section, "warn_unknown_keys", True):
        declared = [field.alias or name for name, field in fields.items()]
        for key in section.model_extra or {}:
            near = difflib.get_close_matches(key, declared, n=1, cutoff=0.75)
            yield f"{prefix}{key}", f"{prefix}{near[0]}" if near else None
    for name, field in fields.items():
        yield from _unknown_below(getattr(section, name), f"{prefix}{field.alias or name}")


def _unknown_below(value: object, path: str) -> Iterator[tuple[str, str | None]]:
    """Unknown keys inside a field value (a section, a list or a mapping of sections)."""
    if isinstance(value, BaseModel):
        yield from _unknown_keys(value, f"{path}.")
    elif isinstance(value, builtins.list):
        for index, item in enumerate(value):
            yield from _unknown_below(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _unknown_below(item, f"{path}.{key}")


# --- loading ------------------------------------------------------------------------------


def parse_config(data: Mapping[str, Any]) -> SwitchboardConfig:
    """Validate an already-parsed config object."""
    return SwitchboardConfig.model_validate(dict(data))


def load_config(path: str | os.PathLike[str] | None) -> SwitchboardConfig:
    """Read and validate a JSON5 config file; no path means all defaults."""
    if path is None:
        return SwitchboardConfig()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {file}", path=str(file)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file not readable: {file}: {exc}", path=str(file)) from exc
    data = _parse_json5(text, file)
    if not isinstance(data, dict):
        kind = _JSON_TYPES.get(type(data), type(data).__name__)
        raise ConfigError(f"invalid config: {file}: the top level must be an object, not {kind}")
    return parse_config(data)


def _parse_json5(text: str, file: Path) -> Any:
    """Parse JSON5 text, reporting syntax errors with line and column."""
    try:
        return json5.loads(text)
    except RecursionError:
        raise ConfigError(f"invalid JSON5 in {file}: nested too deeply", path=str(file)) from None
    except ValueError as exc:
        found = _JSON5_ERROR_RE.match(str(exc))
        where = f"line {found[1]}, column {found[3]}: {found[2]}" if found else str(exc)
        line = int(found[1]) if found else None
        column = int(found[3]) if found else None
        raise ConfigError(
            f"invalid JSON5 in {file}: {where}", path=str(file), line=line, column=column
        ) from exc


# --- infrastructure settings --------------------------------------------------------------


# The scheme of a Redis Cluster URL (read in full by `store.urls`).
REDIS_CLUSTER_SCHEME = "redis+cluster"
REDIS_TLS_CLUSTER_SCHEME = "rediss+cluster"


def cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return bool(url) and str(url).lower().startswith(
        (f"{REDIS_CLUSTER_SCHEME}://", f"{REDIS_TLS_CLUSTER_SCHEME}://")
    )


class Settings(BaseSettings):
    """Infrastructure settings from `SWITCHBOARD_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", env_ignore_empty=True)

    redis_url: str | None = None
    broker_url: str | None = None
    # RabbitMQ only: `quorum` declares the product's queues as quorum queues (replicated;
    # docs/scaling.md). An existing classic queue cannot be redeclared: switch on a new vhost.
    broker_queue_type: Literal["classic", "quorum"] = "classic"
    token: str | None = Field(default=None, repr=False)
    data_dir: Path = Path("./.switchboard")
    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    config: Path | None = None
    key_prefix: str = "sb:"
    log_level: str = "INFO"
    # `json`: one JSON object per log line (for collectors); `console`: for humans;
    # `auto`: console when the process writes to a terminal, JSON otherwise.
    log_format: Literal["auto", "json", "console"] = "auto"
    # How often beat runs the recovery sweep, and how long a lane lease lasts without
    # renewal before the sweep treats its worker as dead (seconds).
    sweep_interval_s: float = Field(default=5.0, gt=0, le=3600)
    lane_lease_s: int = Field(default=30, ge=2, le=3600)
    # Runs one worker process keeps in flight on its event loops (`switchboard worker
    # --max-in-flight`); at the limit it takes no more messages until runs end.
    worker_max_in_flight: int = Field(default=10_000, ge=1)
    # The port a worker serves its Prometheus metrics on (`/metrics`, on `host`; unset:
    # none). An api serves its own on its `/metrics` route.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # Failed bearer-token checks allowed per client IP within the window before the api
    # answers 429 to that IP until the window ends (counted in Redis, shared by every api).
    auth_max_failures: int = Field(default=20, ge=1, le=1_000_000)
    auth_failure_window_s: int = Field(default=60, ge=1, le=86_400)
    # Replicas that must hold a run's accept, its end and a transcript append before the
    # answer (Redis WAIT on the write's connection; 0: off), and how long WAIT may take
    # for them (ms): fewer in time log a WARNING and the write stands (docs/operations.md).
    redis_wait_replicas: int = Field(default=0, ge=0, le=64)
    redis_wait_timeout_ms: int = Field(default=1000, ge=1, le=60_000)
    # How many slot groups the store's keys are cut into (docs/scaling.md): on a Redis
    # Cluster each group is a hash slot of its own, so the state spreads over the shards;
    # unset: 64 on a cluster, 1 (one keyspace, as on one Redis) otherwise. Fixed for the
    # life of a deployment's data: every process refuses to start on a store cut otherwise.
    slot_groups: int | None = Field(default=None, ge=1, le=1024)
    # Refuse (CrossSlotError) a script or transaction whose keys span hash slots, as a
    # Redis Cluster would, on any Redis: the tests run with it on; it costs a CRC per key.
    slot_check: bool = False

    @field_validator("log_level")
    @classmethod
    def _upper_level(cls, value: str) -> str:
        return value.strip().upper()

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_format(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _slot_groups_by_engine(self) -> Self:
        """Unset slot groups are 64 on a Redis Cluster (``redis+cluster://``), 1 elsewhere.
        With one group on a cluster every store key carries the prefix as its hash tag
        (``sb:`` becomes ``{sb}:``, a prefix that already holds a ``{tag}`` is kept), so
        every key is in one slot; with several, each group's keys carry a tag of their own
        (`Keyspace`) and the prefix may hold none."""
        if self.slot_groups is None:
            self.slot_groups = 64 if cluster_url(self.redis_url) else 1
        if self.slot_groups > 1 and ("{" in self.key_prefix or "}" in self.key_prefix):
            raise ValueError(
                f"key_prefix {self.key_prefix!r} holds a {{hash tag}}: with slot_groups "
                f"{self.slot_groups} each group's keys get one of their own"
            )
        if self.slot_groups == 1 and cluster_url(self.redis_url) and "{" not in self.key_prefix:
            self.key_prefix = "{" + self.key_prefix.rstrip(":") + "}:"
        return self

    @property
    def groups(self) -> int:
        """The slot groups (`slot_groups`, resolved)."""
        return self.slot_groups or 1

    @property
    def effective_broker_url(self) -> str | None:
        """The Celery broker: `broker_url` if set, else the Redis URL."""
        return self.broker_url or self.redis_url


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    try:
        return Settings()
    except ValidationError as exc:
        issues = [_issue_from(err) for err in exc.errors()]
        env = [f"SWITCHBOARD_{issue.path.upper()}" for issue in issues]
        shown = [
            str(issue).replace(issue.path, name, 1) for issue, name in zip(issues, env, strict=True)
        ]
        raise ConfigError("invalid setting: " + "; ".join(shown), key_path=env[0]) from exc


def get_config(path: str | os.PathLike[str] | None = None) -> SwitchboardConfig:
    """The config of `path`, else of `SWITCHBOARD_CONFIG`, loaded once per path."""
    chosen = Path(path) if path is not None else get_settings().config
    return _config_at(chosen)


@functools.cache
def _config_at(path: Path | None) -> SwitchboardConfig:
    """Load and remember the config of one path."""
    return load_config(path)


def reset_caches() -> None:
    """Forget the cached settings and configs (tests, reloads)."""
    get_settings.cache_clear()
    _config_at.cache_clear()
