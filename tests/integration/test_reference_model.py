"""The tools' authorization answers agree with a small reference model of SPEC §2, §6, §7.

Hypothesis builds random configs (agents with `subagents.allowAgents` and sandboxes,
`tools.sessions.visibility`, `tools.agentToAgent` with ids and globs, send-policy rules and
per-session overrides), random session sets with random spawn trees, and asks every tool as
every caller: `sessions_list` rows, `sessions_history` and `sessions_send` (fire-and-forget)
allowed / forbidden / blocked by send policy, `sessions_spawn` and `agents_list` allowed
agent ids. The store is the real one (private Redis); the handlers run in-process. The
reference below is written from the SPEC's text and shares no code with the product.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.shared.config import Settings, parse_config
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.tools.catalog import register_session_tools
from switchboard.shared.tools.registry import ToolContext
from switchboard.workers.queue import CeleryQueue

pytestmark = pytest.mark.integration

AGENTS = ("main", "ops", "dev", "qa")
UNCONFIGURED = "zzz"
VISIBILITIES = ("self", "tree", "agent", "all")
CHANNELS = ("discord", "telegram", "webchat")
MIN_CASES = 2000
SEND_BLOCKED = "send blocked by session policy"  # SPEC §5


# --- the reference model (SPEC §2, §6, §7) -------------------------------------------------


def agent_of(key: str) -> str:
    return key.split(":")[1]


def allow_matches(patterns: list[str], agent: str) -> bool:
    """`tools.agentToAgent.allow`: empty = any; `*` globs; blank patterns match nothing."""
    if not patterns:
        return True
    for raw in patterns:
        pattern = raw.strip()
        if not pattern:
            continue
        if "*" in pattern:
            parts = [re.escape(p) for p in pattern.lower().split("*")]
            if re.fullmatch(".*".join(parts), agent.lower()):
                return True
        elif pattern == agent:
            return True
    return False


@dataclass
class World:
    """One random config and session set, as plain data."""

    config: dict[str, Any]
    sessions: dict[str, dict[str, Any]]  # key → entry fields (channel, chatType, sendPolicy)
    children: dict[str, list[str]] = field(default_factory=dict)

    def section(self, *path: str) -> Any:
        node: Any = self.config
        for name in path:
            node = node.get(name, {}) if isinstance(node, dict) else {}
        return node

    def entry(self, agent: str) -> dict[str, Any]:
        return next((e for e in self.section("agents").get("list", []) if e["id"] == agent), {})

    def sandbox(self, agent: str) -> dict[str, Any]:
        """The agent's sandbox: its own keys over `agents.defaults.sandbox`."""
        merged = {"mode": "off", "sessionToolsVisibility": "spawned"}
        merged.update(self.section("agents", "defaults", "sandbox"))
        merged.update(self.entry(agent).get("sandbox", {}))
        return merged

    def visibility(self, caller: str) -> str:
        """SPEC §2: the configured level; a sandboxed caller with `spawned` is clamped to tree."""
        configured = self.section("tools", "sessions").get("visibility", "agent")
        box = self.sandbox(agent_of(caller))
        is_main = caller == f"agent:{agent_of(caller)}:main"
        sandboxed = box["mode"] == "all" or (box["mode"] == "non-main" and not is_main)
        if sandboxed and box["sessionToolsVisibility"] == "spawned":
            return "tree"
        return str(configured)

    def spawned(self, caller: str) -> set[str]:
        """The sessions ``caller`` spawned, transitively."""
        out: set[str] = set()
        todo = [caller]
        while todo:
            for child in self.children.get(todo.pop(), []):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        return out

    def visible(self, caller: str, target: str) -> bool:
        """SPEC §2."""
        if caller == target:
            return True
        level = self.visibility(caller)
        if level == "tree" and target in self.spawned(caller):
            return True
        if agent_of(caller) != agent_of(target):
            a2a = self.section("tools", "agentToAgent")
            allow = a2a.get("allow", [])
            return (
                level == "all"
                and a2a.get("enabled", False) is True
                and allow_matches(allow, agent_of(caller))
                and allow_matches(allow, agent_of(target))
            )
        return level in ("agent", "all")

    def send_allowed(self, target: str) -> bool:
        """SPEC §6: override, else first matching deny, else any matching allow, else default."""
        entry = self.sessions[target]
        if entry.get("sendPolicy") in ("allow", "deny"):
            return bool(entry["sendPolicy"] == "allow")
        policy = self.section("session", "sendPolicy")
        if not policy:
            return True
        stripped = target.split(":", 2)[2]
        matched_allow = False
        for rule in policy.get("rules", []):
            match = rule.get("match") or {}
            chat_type = {"dm": "direct"}.get(match.get("chatType"), match.get("chatType"))
            prefix = match.get("keyPrefix")
            if match.get("channel") and match["channel"] != entry["channel"]:
                continue
            if chat_type and chat_type != entry["chatType"]:
                continue
            if prefix and not (target.startswith(prefix) or stripped.startswith(prefix)):
                continue
            if rule.get("action", "allow") == "deny":
                return False
            matched_allow = True
        return matched_allow or policy.get("default", "allow") == "allow"

    def spawn_allowed(self, caller: str, target_agent: str) -> bool:
        """SPEC §7: own agent always; else `allowAgents` (`*` = any; default: none)."""
        own = agent_of(caller)
        if target_agent == own:
            return True
        subagents = self.entry(own).get("subagents", {})
        allow = subagents.get("allowAgents")
        if allow is None:
            allow = self.section("agents", "defaults", "subagents").get("allowAgents", [])
        names = {name.strip().lower() for name in allow if name.strip()}
        return "*" in names or target_agent in names

    def spawnable(self, caller: str) -> set[str]:
        """SPEC §8: `agents_list` ids: the requester, plus every configured id or the list."""
        own = agent_of(caller)
        subagents = self.entry(own).get("subagents", {})
        allow = subagents.get("allowAgents")
        if allow is None:
            allow = self.section("agents", "defaults", "subagents").get("allowAgents", [])
        names = {name.strip().lower() for name in allow if name.strip()}
        if "*" in names:
            return {own, *(e["id"] for e in self.section("agents").get("list", []))}
        return {own, *names}


# --- random worlds ---------------------------------------------------------------------------

allow_patterns = st.lists(
    st.sampled_from(["*", "main", "ops", "dev", "qa", "o*", "*v", "d*v", "m*n", "", " ops "]),
    max_size=3,
)
sandbox = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["off", "non-main", "all"]),
        "sessionToolsVisibility": st.sampled_from(["spawned", "all"]),
    },
)
allow_agents = st.lists(
    st.sampled_from(["*", "main", "ops", "dev", "qa", "OPS", " qa ", UNCONFIGURED]), max_size=3
)
rule = st.fixed_dictionaries(
    {"action": st.sampled_from(["allow", "deny"])},
    optional={
        "match": st.fixed_dictionaries(
            {},
            optional={
                "channel": st.sampled_from(CHANNELS),
                "chatType": st.sampled_from(["direct", "group", "channel", "dm"]),
                "keyPrefix": st.sampled_from(
                    ["agent:ops:", "discord:", "cron:", "agent:main:telegram", "subagent:"]
                ),
            },
        )
    },
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    ids = draw(st.lists(st.sampled_from(AGENTS), min_size=1, max_size=4, unique=True))
    entries = []
    for agent in ids:
        entry: dict[str, Any] = {"id": agent}
        if draw(st.booleans()):
            entry["subagents"] = {"allowAgents": draw(allow_agents)}
        if draw(st.booleans()):
            entry["sandbox"] = draw(sandbox)
        entries.append(entry)
    config: dict[str, Any] = {
        "agents": {
            "list": entries,
            "defaults": {
                "sandbox": draw(sandbox),
                "subagents": {"allowAgents": draw(allow_agents), "maxChildrenPerAgent": 10_000},
            },
        },
        "tools": {
            "sessions": {"visibility": draw(st.sampled_from(VISIBILITIES))},
            "agentToAgent": {"enabled": draw(st.booleans()), "allow": draw(allow_patterns)},
        },
    }
    if draw(st.booleans()):
        config["session"] = {
            "sendPolicy": {
                "rules": draw(st.lists(rule, max_size=4)),
                "default": draw(st.sampled_from(["allow", "deny"])),
            }
        }
    return config


def session_fields(key: str, draw: st.DrawFn) -> dict[str, Any]:
    """The entry fields the reference reads: channel, chat type, optional override."""
    rest = key.split(":", 2)[2].split(":")
    if len(rest) >= 3 and rest[1] in ("group", "channel"):
        fields: dict[str, Any] = {"channel": rest[0], "chatType": rest[1]}
    elif rest[0] in ("cron", "subagent"):
        fields = {"channel": "internal", "chatType": "direct"}
    else:
        fields = {"channel": draw(st.sampled_from(CHANNELS)), "chatType": "direct"}
    override = draw(st.sampled_from([None, None, "allow", "deny"]))
    if override:
        fields["sendPolicy"] = override
    return fields


@st.composite
def worlds(draw: st.DrawFn) -> World:
    config = draw(configs())
    agents = sorted({e["id"] for e in config["agents"]["list"]} | {"main"})
    shapes = [
        "main",
        "discord:group:g1",
        "telegram:channel:c1",
        "cron:nightly",
        "webchat:direct:u1",
    ]
    keys: list[str] = []
    for agent in agents:
        keys += [f"agent:{agent}:{s}" for s in draw(st.sets(st.sampled_from(shapes), max_size=4))]
    keys = keys or ["agent:main:main"]
    children: dict[str, list[str]] = {}
    for _ in range(draw(st.integers(0, 8))):
        parent = draw(st.sampled_from(keys))
        child = f"agent:{draw(st.sampled_from(agents))}:subagent:{uuid.uuid4()}"
        children.setdefault(parent, []).append(child)
        keys.append(child)
    sessions = {key: session_fields(key, draw) for key in keys}
    return World(config=config, sessions=sessions, children=children)


# --- the product, in-process on the real store ---------------------------------------------


@pytest.fixture
def build(
    redis_url: str, settings: Settings, celery_app: Celery, redis_client: redis.Redis
) -> Iterator[Any]:
    """Load a World into the private Redis and return Services configured for it."""
    store = Store(redis_client, prefix=settings.key_prefix)
    queue = CeleryQueue(celery_app)

    def load(world: World) -> Services:
        for key in redis_client.scan_iter(match=f"{settings.key_prefix}*", count=1000):
            redis_client.delete(key)
        svc = Services(
            store=store, config=parse_config(world.config), settings=settings, queue=queue
        )
        register_session_tools(svc.tools)
        depth = {child: 1 for kids in world.children.values() for child in kids}
        for key, fields in world.sessions.items():
            store.sessions.ensure(key, on_create={**fields, "spawnDepth": depth.get(key, 0)})
        for parent, kids in world.children.items():
            for child in kids:
                store.sessions.add_child(parent, child)
        return svc

    yield load


@pytest.fixture
def tally() -> Iterator[dict[str, int]]:
    """Cases checked by the property; at teardown, at least MIN_CASES of them."""
    counts = {"cases": 0, "worlds": 0}
    yield counts
    print(f"reference model: {counts['cases']} cases agreed in {counts['worlds']} worlds")
    assert counts["cases"] >= MIN_CASES, counts


def context(svc: Services, key: str) -> ToolContext:
    """Who is acting, as the server derives it (the api's /tools/invoke does the same)."""
    agent = agent_of(key)
    return ToolContext(
        services=svc,
        session_key=key,
        agent_id=agent,
        channel="webchat",
        sandboxed=svc.config.is_sandboxed(agent, key == f"agent:{agent}:main"),
        owner=True,
        spawn_depth=1 if ":subagent:" in key else 0,
    )


def call(svc: Services, caller: str, tool: str, **args: Any) -> dict[str, Any]:
    spec = svc.tools.get(tool)
    assert spec is not None
    result: dict[str, Any] = spec.handler(context(svc, caller), args)
    return result


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(world=worlds())
def test_tool_answers_agree_with_the_reference_model(
    world: World, build: Any, tally: dict[str, int]
) -> None:
    """Every (caller, target, tool) answer matches the reference; zero disagreements."""
    svc = build(world)
    keys = sorted(world.sessions)
    cases = 0
    for caller in keys:
        ctx_label = f"caller={caller} config={world.config}"
        rows = call(svc, caller, "sessions_list")
        listed = {
            f"agent:{agent_of(caller)}:main" if r["key"] == "main" else r["key"]
            for r in rows["sessions"]
        }
        assert listed == {t for t in keys if world.visible(caller, t)}, ctx_label
        assert rows["scope"]["visibility"] == world.visibility(caller), ctx_label
        cases += 1
        for target in keys:
            history = call(svc, caller, "sessions_history", sessionKey=target)
            assert ("messages" in history) == world.visible(caller, target), (target, ctx_label)
            if "messages" not in history:
                assert history["status"] == "forbidden", history
            sent = call(
                svc, caller, "sessions_send", sessionKey=target, message="hi", timeoutSeconds=0
            )
            if not world.visible(caller, target):
                expected = "forbidden"
            elif not world.send_allowed(target):
                expected = "error"
            else:
                expected = "accepted"
            assert sent["status"] == expected, (target, sent, ctx_label, world.sessions[target])
            if expected == "error":
                assert sent["error"] == SEND_BLOCKED, sent
            cases += 2
    for caller in (k for k in keys if ":subagent:" not in k):
        ids = {a["id"] for a in call(svc, caller, "agents_list")["agents"]}
        assert ids == world.spawnable(caller), (caller, world.config)
        cases += 1
        for agent in (*AGENTS, UNCONFIGURED):
            spawned = call(svc, caller, "sessions_spawn", task="t", agentId=agent)
            denied = spawned["status"] == "forbidden" and "not allowed" in spawned["error"]
            assert denied != world.spawn_allowed(caller, agent), (caller, agent, spawned)
            if not denied:  # started, unless the new child's send policy denies runs
                assert spawned["status"] == "accepted" or spawned["error"] == SEND_BLOCKED, spawned
            cases += 1
    tally["cases"] += cases
    tally["worlds"] += 1
