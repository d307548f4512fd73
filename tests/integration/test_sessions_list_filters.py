"""`sessions_list` filters `label`, `agentId` and `search` over the real api, Redis and worker.

Calls go through `POST /tools/invoke` acting for a session (and once through an agent run
whose echo model calls the tool); sessions are seeded straight into the store.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import httpx
import pytest

import switchboard.shared.store.sessions as session_store
import switchboard.shared.tools.sessions_list as sessions_list
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
Seed = Callable[..., str]
ALL_AGENTS = {"tools": {"sessions": {"visibility": "all"}, "agentToAgent": {"enabled": True}}}


def configured(data: dict[str, Any]) -> pytest.MarkDecorator:
    """Run the test with this JSON config (indirect parametrization of `config_data`)."""
    return pytest.mark.parametrize("config_data", [data], indirect=True)


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test's config: `{}` (default visibility) unless parametrized."""
    return dict(getattr(request, "param", {}))


@pytest.fixture
def seed(services: Services) -> Iterator[Seed]:
    """Create a session entry, each one 1 s newer than the last; returns its sessionId."""
    clock = itertools.count(now_ms() - 30 * 60_000, 1000)

    def create(key: str, **fields: Any) -> str:
        with mock.patch.object(session_store, "now_ms", return_value=next(clock)):
            session_id, _ = services.store.sessions.ensure(key, on_create=fields)
        return session_id

    yield create


@pytest.fixture
def invoke(client: httpx.Client) -> Callable[..., Any]:
    """Call a tool over `POST /tools/invoke` for a session and return its result."""

    def call(tool: str, args: dict[str, Any] | None = None, session: str = "main") -> Any:
        body = {"tool": tool, "args": args or {}, "sessionKey": session}
        resp = client.post("/tools/invoke", json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["ok"] is True
        return answer["result"]

    return call


def keys_of(result: dict[str, Any]) -> list[str]:
    """The row keys of a sessions_list result, in order (and count agrees)."""
    assert result["count"] == len(result["sessions"])
    return [row["key"] for row in result["sessions"]]


@pytest.fixture
def crowd(seed: Seed, services: Services) -> dict[str, str]:
    """Sessions of agents main and ops, some labelled or named; oldest first."""
    keys = {
        "main": MAIN,
        "build": "agent:main:cron:nightly",
        "dev": "agent:main:discord:group:dev",
        "planning": "agent:main:hook:planning",
        "ops_main": "agent:ops:main",
        "ops_deploy": "agent:ops:cron:deploy",
    }
    seed(keys["main"])
    seed(keys["build"], label="Nightly-Build")
    seed(keys["dev"], subject="dev")
    seed(keys["planning"], displayName="Release Planning")
    seed(keys["ops_main"], label="ops-home")
    seed(keys["ops_deploy"], displayName="Deploy planning")
    return keys


# --- label --------------------------------------------------------------------------------


def test_label_returns_only_the_session_with_that_label(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """Before this filter every session came back; now exactly the labelled one does."""
    everything = keys_of(invoke("sessions_list"))
    assert len(everything) == 4  # the default `agent` visibility: main's sessions
    listed = invoke("sessions_list", {"label": "Nightly-Build"})
    assert keys_of(listed) == [crowd["build"]]
    assert listed["sessions"][0]["label"] == "Nightly-Build"
    assert keys_of(invoke("sessions_list", {"label": "nightly-build"})) == []  # exact match
    assert keys_of(invoke("sessions_list", {"label": "no-such-label"})) == []
    # Other filters still apply on top of the label.
    assert keys_of(invoke("sessions_list", {"label": "Nightly-Build", "kinds": ["main"]})) == []
    assert keys_of(invoke("sessions_list", {"label": "Nightly-Build", "agentId": "ops"})) == []


def test_a_label_outside_visibility_lists_nothing(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """Under the default `agent` visibility another agent's labelled session stays hidden."""
    assert keys_of(invoke("sessions_list", {"label": "ops-home"})) == []
    assert keys_of(invoke("sessions_list", {"label": "ops-home"}, session="agent:ops:main")) == [
        "main"
    ]


@configured(ALL_AGENTS)
def test_label_reaches_other_agents_when_agent_to_agent_allows(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """With visibility `all` and agent-to-agent on, a label finds another agent's session."""
    assert keys_of(invoke("sessions_list", {"label": "ops-home"})) == [crowd["ops_main"]]


@configured({"tools": {"sessions": {"visibility": "tree"}}})
def test_label_under_tree_is_limited_to_the_callers_tree(
    invoke: Callable[..., Any], crowd: dict[str, str], seed: Seed, services: Services
) -> None:
    """`tree`: a label outside the caller's spawned tree lists nothing; inside it lists."""
    assert keys_of(invoke("sessions_list", {"label": "Nightly-Build"})) == []
    child = "agent:main:subagent:kid"
    seed(child, label="kid-label", spawnedBy=MAIN)
    services.store.sessions.add_child(MAIN, child)
    assert keys_of(invoke("sessions_list", {"label": "kid-label"})) == [child]


# --- agentId ------------------------------------------------------------------------------


@configured(ALL_AGENTS)
def test_agent_id_returns_only_that_agents_sessions(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """`agentId` narrows a cross-agent listing to one agent, newest first; any case."""
    assert len(keys_of(invoke("sessions_list"))) == 6
    ops = [crowd["ops_deploy"], crowd["ops_main"]]
    assert keys_of(invoke("sessions_list", {"agentId": "ops"})) == ops
    assert keys_of(invoke("sessions_list", {"agentId": "OPS"})) == ops
    assert keys_of(invoke("sessions_list", {"agentId": "ops", "kinds": ["cron"]})) == ops[:1]
    assert keys_of(invoke("sessions_list", {"agentId": "nobody"})) == []
    mains = keys_of(invoke("sessions_list", {"agentId": "main"}))
    assert mains == [crowd["planning"], crowd["dev"], crowd["build"], "main"]


def test_agent_id_cannot_widen_the_default_visibility(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """Under `agent`, another agent's id lists nothing; the caller's own id lists its own."""
    assert keys_of(invoke("sessions_list", {"agentId": "ops"})) == []
    assert len(keys_of(invoke("sessions_list", {"agentId": "main"}))) == 4


def test_agent_id_longer_than_64_characters_is_invalid(client: httpx.Client) -> None:
    """OpenClaw's schema caps agentId at 64 characters: longer is a 400, not a listing."""
    body = {"tool": "sessions_list", "args": {"agentId": "a" * 65}, "sessionKey": "main"}
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 400, resp.text
    assert "agentId must be at most 64 characters" in resp.json()["error"]["message"]


# --- search -------------------------------------------------------------------------------


@configured(ALL_AGENTS)
def test_search_matches_key_label_display_name_and_session_id(
    invoke: Callable[..., Any], crowd: dict[str, str], seed: Seed
) -> None:
    """Case-insensitive substring of the key, the label, the display name or the sessionId."""
    assert keys_of(invoke("sessions_list", {"search": "PLANNING"})) == [
        crowd["ops_deploy"],
        crowd["planning"],
    ]
    assert keys_of(invoke("sessions_list", {"search": "build"})) == [crowd["build"]]
    assert keys_of(invoke("sessions_list", {"search": "group:dev"})) == [crowd["dev"]]
    assert keys_of(invoke("sessions_list", {"search": "discord:g-dev"})) == [crowd["dev"]]
    session_id = seed("agent:main:cron:by-id")
    assert keys_of(invoke("sessions_list", {"search": session_id[:13].upper()})) == [
        "agent:main:cron:by-id"
    ]
    assert keys_of(invoke("sessions_list", {"search": "nothing-like-this"})) == []
    # Combined with the other filters.
    assert keys_of(invoke("sessions_list", {"search": "planning", "agentId": "main"})) == [
        crowd["planning"]
    ]
    assert keys_of(invoke("sessions_list", {"search": "planning", "kinds": ["cron"]})) == [
        crowd["ops_deploy"]
    ]


def test_search_matches_the_key_as_the_caller_sees_it(
    invoke: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """The caller's main session shows as `main`; searching `main` finds it."""
    assert "main" in keys_of(invoke("sessions_list", {"search": "main"}))


def test_search_stops_at_limit_matches_after_one_page(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """Enough matches on the first index page: `limit` rows, no further page read."""
    for index in range(30):
        seed(f"agent:main:cron:job-{index:02d}")
    pages = mock.patch.object(
        services.store.sessions, "recent_page", wraps=services.store.sessions.recent_page
    )
    with pages as spy:
        listed = invoke("sessions_list", {"search": "JOB-", "limit": 3})
    assert keys_of(listed) == [f"agent:main:cron:job-{i}" for i in ("29", "28", "27")]
    assert spy.call_count == _first_page_reads(services)
    assert "partial" not in listed["scope"]


def test_search_pages_through_the_index_and_is_bounded(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """A rare match deep in the index is found page by page; past the scan bound the
    listing stops and says it is partial."""
    seed("agent:main:cron:needle")
    for index in range(450):
        seed(f"agent:main:cron:hay-{index:03d}")
    with mock.patch.object(
        services.store.sessions, "recent_page", wraps=services.store.sessions.recent_page
    ) as spy:
        found = invoke("sessions_list", {"search": "needle"})
    assert keys_of(found) == ["agent:main:cron:needle"]
    # 451 entries: the first page (200), then 200 and 51
    assert spy.call_count == 2 + _first_page_reads(services)
    with mock.patch.object(sessions_list, "_SCAN_LIMIT", 400):
        bounded = invoke("sessions_list", {"search": "needle"})
    assert keys_of(bounded) == []
    assert bounded["scope"]["partial"] is True


@configured({"tools": {"sessions": {"visibility": "tree"}}})
def test_search_and_agent_id_under_tree_filter_the_callers_tree(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """On the `tree` path (known keys, no index) the filters apply the same way."""
    seed(MAIN)
    kids = {"agent:main:subagent:alpha": "Alpha worker", "agent:ops:subagent:beta": "Beta"}
    for key, name in kids.items():
        seed(key, displayName=name, spawnedBy=MAIN)
        services.store.sessions.add_child(MAIN, key)
    seed("agent:main:cron:alpha-outside")
    assert keys_of(invoke("sessions_list", {"search": "alpha"})) == ["agent:main:subagent:alpha"]
    assert keys_of(invoke("sessions_list", {"agentId": "ops"})) == ["agent:ops:subagent:beta"]


# --- the same filters through the model loop, the gateway method and the CLI -----------------


def test_filters_work_when_an_agent_run_calls_the_tool(
    worker: Any, rpc: Callable[..., Any], crowd: dict[str, str]
) -> None:
    """The echo model calls sessions_list with a label and a search inside a run."""
    lines = [
        '/tool sessions_list {"label": "Nightly-Build"}',
        '/tool sessions_list {"search": "planning"}',
    ]
    started = rpc("agent", sessionKey="main", message="\n".join(lines))
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok", outcome
    by_label, by_search = (json.loads(line) for line in outcome["reply"].split("\n"))
    assert keys_of(by_label) == [crowd["build"]]
    assert keys_of(by_search) == [crowd["planning"]]


def test_cli_sessions_passes_the_filters_to_the_gateway(
    api_url: str, crowd: dict[str, str]
) -> None:
    """`switchboard sessions --label/--agent/--search` list what `sessions.list` filters."""
    from typer.testing import CliRunner

    from switchboard import cli

    def run(*options: str) -> list[str]:
        result = CliRunner().invoke(
            cli.app, ["sessions", "--url", api_url, "--token", "test-token", "--json", *options]
        )
        assert result.exit_code == 0, result.output
        return [row["key"] for row in json.loads(result.stdout)["sessions"]]

    assert run("--label", "Nightly-Build") == [crowd["build"]]
    assert run("--agent", "ops") == [crowd["ops_deploy"], crowd["ops_main"]]
    assert run("--search", "planning", "--agent", "main") == [crowd["planning"]]


def _first_page_reads(services: Services) -> int:
    """`recent_page` calls a listing's first page makes: none with one slot group (its
    indexes and entries are read in one step), one with several (indexes, then entries)."""
    return 0 if services.store.ks.groups == 1 else 1
