"""Scoped api tokens: every surface takes them, none lets them act outside their scope.

Real parts throughout: the api over HTTP (uvicorn), the real `openai` and MCP clients, the
CLI as a subprocess, two `switchboard api` processes for revocation, a real worker where a
run is started. A property test draws random scopes, tools and session keys and finds no
call that succeeds outside its token's scope.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from switchboard.shared import keys as sk
from switchboard.shared.config import Settings
from switchboard.shared.services import Services
from switchboard.shared.store.audit import AsyncAuditStore, AuditEntry
from switchboard.shared.store.client import connect_async
from switchboard_testkit.procs import stop_groups

pytestmark = pytest.mark.integration

TOKEN = "test-token"  # the integration conftest's owner token
AGENTS = ["main", "alpha", "beta"]
READ_TOOLS = ["sessions_list", "session_status", "sessions_history", "agents_list"]
# Arguments a read tool needs (sessions_history reads the caller's own session).
TOOL_ARGS: dict[str, dict[str, Any]] = {"sessions_history": {"sessionKey": "current"}}
TOKEN_SHAPE = re.compile(r"sbt_[0-9a-f]{16}_[A-Za-z0-9_-]+")


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Three agents, short runs."""
    return {
        "agents": {"list": [{"id": "main", "default": True}, {"id": "alpha"}, {"id": "beta"}]},
        "runs": {"timeoutSeconds": 5},
    }


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def issue(services: Services, agent: str, **scope: Any) -> tuple[str, str]:
    """(token, id) of a new scoped token, made through the store as the CLI makes it."""
    issued = services.store.tokens.create(agent, **scope)
    return issued.token, issued.record.token_id


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for ``token``."""
    return {"Authorization": f"Bearer {token}"}


def invoke(api_url: str, token: str, tool: str, session_key: str | None = None) -> httpx.Response:
    """POST /tools/invoke with ``token``."""
    body: dict[str, Any] = {"tool": tool, "args": TOOL_ARGS.get(tool, {})}
    if session_key is not None:
        body["sessionKey"] = session_key
    return httpx.post(f"{api_url}/tools/invoke", json=body, headers=bearer(token), timeout=30)


def rpc(api_url: str, token: str, method: str, **params: Any) -> httpx.Response:
    """POST /rpc with ``token``."""
    body = {"method": method, "params": params}
    return httpx.post(f"{api_url}/rpc", json=body, headers=bearer(token), timeout=30)


# ---- the surfaces -----------------------------------------------------------------------


def test_tools_and_rpc_act_only_as_the_tokens_agent(api_url: str, services: Services) -> None:
    """/tools/invoke and /rpc: the token's agent's sessions pass, others are a clear 403;
    a bare or missing key means the token's agent's session, never the default agent's."""
    token, token_id = issue(services, "alpha")
    ok = invoke(api_url, token, "session_status")
    assert ok.status_code == 200, ok.text
    assert services.store.audit.recent(1)[0].session_key == "agent:alpha:main"
    refused = invoke(api_url, token, "session_status", "agent:beta:main")
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    assert token_id in message and "not a session of agent 'alpha'" in message
    assert rpc(api_url, token, "chat.history", sessionKey="agent:alpha:main").status_code == 200
    assert rpc(api_url, token, "chat.history", sessionKey="agent:beta:main").status_code == 403
    assert rpc(api_url, token, "agent", agentId="beta", message="hi").status_code == 403
    listing = rpc(api_url, token, "sessions.list")
    assert listing.status_code == 403 and "owner token" in listing.json()["error"]["message"]
    assert rpc(api_url, token, "chat.send", message="/send off").status_code == 403
    # In scope, a tool is judged by policy as the agent's session: another agent's session
    # is a `forbidden` result, audited with the tool's own status.
    body = {"tool": "sessions_send", "args": {"sessionKey": "agent:beta:main", "message": "x"}}
    sent = httpx.post(f"{api_url}/tools/invoke", json=body, headers=bearer(token), timeout=30)
    assert sent.status_code == 200 and sent.json()["result"]["status"] == "forbidden"
    assert services.store.audit.recent(1)[0].outcome == "forbidden"


def test_session_and_tool_scopes_narrow_further(api_url: str, services: Services) -> None:
    """A session-scoped token acts as that session only (its default); a tool list limits
    the tools and refuses run-starting methods."""
    token, _ = issue(services, "alpha", session_key="agent:alpha:hook:ci", tools=["session_status"])
    assert invoke(api_url, token, "session_status").status_code == 200
    assert services.store.audit.recent(1)[0].session_key == "agent:alpha:hook:ci"
    assert invoke(api_url, token, "session_status", "hook:ci").status_code == 200
    assert invoke(api_url, token, "session_status", "agent:alpha:main").status_code == 403
    assert invoke(api_url, token, "sessions_list").status_code == 403
    started = rpc(api_url, token, "agent", sessionKey="hook:ci", message="hi")
    assert started.status_code == 403 and "may only call its tools" in started.text


def test_owner_only_surfaces_refuse_a_scoped_token(api_url: str, services: Services) -> None:
    """/metrics, the console's login, /events and transcripts need the owner token."""
    token, _ = issue(services, "main")
    for method, path in [
        ("GET", "/metrics"),
        ("POST", "/console/login"),
        ("GET", "/events"),
        ("GET", "/sessions/main/transcript.jsonl"),
    ]:
        resp = httpx.request(method, f"{api_url}{path}", headers=bearer(token), timeout=10)
        assert resp.status_code == 403, (path, resp.text)
        assert "owner token" in resp.json()["error"]["message"]
        assert "set-cookie" not in resp.headers
    owner = httpx.get(f"{api_url}/metrics", headers=bearer(TOKEN), timeout=10)
    assert owner.status_code == 200
    assert httpx.get(f"{api_url}/console", timeout=10).status_code == 200  # the page shell


def test_openai_routes_take_scoped_tokens(
    worker: Any, api_url: str, services: Services, settings: Settings
) -> None:
    """The real openai client: its agent's model answers; another agent's is a 403 in
    OpenAI's shape; the model listing shows only its agent; /send is not the owner's."""
    token, _ = issue(services, "alpha")
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=token, max_retries=0, timeout=30
    ) as client:
        assert [m.id for m in client.models.list().data] == ["switchboard/alpha"]
        done = client.chat.completions.create(
            model="switchboard/alpha", messages=[{"role": "user", "content": "hello alpha"}]
        )
        assert done.choices[0].message.content == "hello alpha"
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.chat.completions.create(
                model="switchboard/beta", messages=[{"role": "user", "content": "hi"}]
            )
        assert denied.value.body["type"] == "permission_error"  # type: ignore[index]
        assert "agent 'beta'" in denied.value.body["message"]  # type: ignore[index]
        reply = client.responses.create(model="switchboard/alpha", input="hello responses")
        assert reply.output_text == "hello responses"
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(
                model="switchboard/alpha", messages=[{"role": "user", "content": "/send off"}]
            )
    narrow, _ = issue(services, "alpha", session_key="agent:alpha:main")
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=narrow, max_retries=0, timeout=30
    ) as client:  # a session-scoped token: its session is the default, no other
        assert client.responses.create(model="switchboard/alpha", input="mine").output_text
        with pytest.raises(openai.PermissionDeniedError):
            client.responses.create(
                model="switchboard/alpha",
                input="hi",
                extra_headers={"x-switchboard-session-key": "agent:alpha:hook:other"},
            )
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=30
    ) as owner:  # the owner's response is not the token's to read
        mine = owner.responses.create(model="switchboard/main", input="owner only", background=True)
    other = httpx.get(f"{api_url}/v1/responses/{mine.id}", headers=bearer(token), timeout=10)
    assert other.status_code == 404, "another scope's response reads as an unknown one"
    unknown = httpx.get(f"{api_url}/v1/responses/resp_nosuch", headers=bearer(token), timeout=10)
    assert other.json()["error"]["message"] == unknown.json()["error"]["message"].replace(
        "resp_nosuch", mine.id
    )
    assert "agent:main" not in other.text


def mcp_session(api_url: str, token: str, session_key: str | None, use: Any) -> Any:
    """Open an MCP session on `/mcp` with ``token`` (acting as ``session_key``), run ``use``."""

    async def main() -> Any:
        headers = bearer(token)
        if session_key is not None:
            headers["x-switchboard-session-key"] = session_key
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"{api_url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await use(session)

    return anyio.run(main)


def test_mcp_takes_scoped_tokens(api_url: str, services: Services) -> None:
    """The MCP client: only the token's tools are listed and callable; another agent's
    session is an MCP error; each call is audited with its outcome."""
    token, token_id = issue(services, "alpha", tools=["session_status", "agents_list"])

    async def own(session: ClientSession) -> tuple[set[str], bool, bool]:
        names = {t.name for t in (await session.list_tools()).tools}
        ok = await session.call_tool("agents_list", {})
        refused = await session.call_tool("sessions_list", {})
        return names, ok.is_error, refused.is_error

    names, ok_error, refused_error = mcp_session(api_url, token, None, own)
    assert names == {"session_status", "agents_list"}
    assert not ok_error and refused_error

    async def other(session: ClientSession) -> str:
        try:
            await session.list_tools()
        except MCPError as exc:
            return str(exc)
        return "listed"

    assert "may not act as that session" in mcp_session(api_url, token, "agent:beta:main", other)
    # An MCP client reads its result from the SSE stream before the stream closes, and the
    # entry is written as the stream closes: it may land a moment after the call returns.
    deadline = time.monotonic() + 10
    while True:
        calls = [e for e in services.store.audit.recent(50, token_id=token_id) if e.tool]
        if len(calls) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(e.surface, e.tool, e.outcome) for e in calls] == [
        ("mcp", "agents_list", "ok"),
        ("mcp", "sessions_list", "refused"),
    ]
    assert {e.session_key for e in calls} == {"agent:alpha:main"}


# ---- the property: no call acts outside its token's scope ---------------------------------

SESSION_REFS = [
    None,
    "main",
    "hook:x",
    "agent:main:main",
    "agent:alpha:main",
    "agent:alpha:hook:x",
    "agent:beta:hook:x",
]
scopes = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(AGENTS),
        "session": st.sampled_from([None, "main", "hook:x"]),
        "tools": st.one_of(st.none(), st.sets(st.sampled_from(READ_TOOLS), min_size=1)),
    }
)
calls = st.lists(
    st.tuples(
        st.sampled_from(["tools", "rpc"]),
        st.sampled_from(READ_TOOLS),
        st.sampled_from(SESSION_REFS),
    ),
    min_size=1,
    max_size=4,
)


def expected_key(ref: str | None, agent: str, session: str | None) -> str:
    """The session a call acts as: the ref named, else the token's session, else main."""
    return sk.canonical_key(ref or session or "main", agent_id=agent)


@hsettings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scope=scopes, drawn=calls)
def test_property_no_call_acts_outside_its_scope(
    api_url: str, services: Services, scope: dict[str, Any], drawn: list[Any]
) -> None:
    """Random scopes, tools and session keys: a call succeeds exactly when its acting
    session and tool are in scope, and the audit names the session it acted as."""
    session = (
        sk.canonical_key(scope["session"], agent_id=scope["agent"]) if scope["session"] else None
    )
    token, token_id = issue(services, scope["agent"], session_key=session, tools=scope["tools"])
    for surface, tool, ref in drawn:
        key = expected_key(ref, scope["agent"], session)
        in_scope = sk.agent_id_of(key) == scope["agent"] and session in (None, key)
        if surface == "tools":
            in_scope = in_scope and (scope["tools"] is None or tool in scope["tools"])
            resp = invoke(api_url, token, tool, ref)
        else:
            resp = rpc(api_url, token, "chat.history", **({"sessionKey": ref} if ref else {}))
        assert resp.status_code == (200 if in_scope else 403), (
            scope,
            surface,
            tool,
            ref,
            resp.text,
        )
        entry = services.store.audit.recent(1, token_id=token_id)[0]
        assert entry.outcome != "refused" if in_scope else entry.outcome == "refused"
        if in_scope:
            assert entry.session_key == key


# ---- the CLI and revocation ------------------------------------------------------------


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `switchboard <args>` as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def cli_env(redis_url: str, tmp_path: Path, config_data: dict[str, Any]) -> dict[str, str]:
    """The environment of a CLI (or api) process on this test's Redis and config."""
    config_file = tmp_path / "switchboard.json5"
    config_file.write_text(json.dumps(config_data))
    env = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": TOKEN,
        "SWITCHBOARD_CONFIG": str(config_file),
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
        # The revocation test's refused requests must not lock this client out.
        "SWITCHBOARD_AUTH_MAX_FAILURES": "1000",
    }
    return env


def test_cli_creates_once_lists_without_secret_audits_and_revokes(
    api_url: str, cli_env: dict[str, str], redis_client: Any
) -> None:
    """`token create` prints the token once (Redis keeps only a hash), `token list` shows
    scope, label and last use but no secret, `audit` shows the calls, `token revoke` ends
    it (exit 1 the second time); bad input is exit 2."""
    made = cli(
        cli_env,
        "token",
        "create",
        "--agent",
        "alpha",
        "--session",
        "main",
        "--tools",
        "session_status,sessions_list",
        "--ttl",
        "1h",
        "--label",
        "ci bot",
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert TOKEN_SHAPE.fullmatch(token), made.stdout
    token_id, secret = token[4:20], token[21:]
    assert invoke(api_url, token, "sessions_list").status_code == 200
    assert invoke(api_url, token, "sessions_list", "agent:beta:main").status_code == 403
    stored = b" ".join(
        b" ".join(redis_client.hgetall(k).values()) for k in redis_client.scan_iter(b"sb:*tok:*")
    )
    assert secret.encode() not in stored
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in stored
    listed = cli(cli_env, "token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert secret not in listed.stdout
    (row,) = json.loads(listed.stdout)
    assert row["id"] == token_id and row["label"] == "ci bot"
    assert row["agentId"] == "alpha" and row["sessionKey"] == "agent:alpha:main"
    assert row["tools"] == ["session_status", "sessions_list"]
    assert row["lastUsedAt"] and row["expiresAt"] - row["createdAt"] == 3_600_000
    table = cli(cli_env, "token", "list")
    assert token_id in table.stdout and "ci bot" in table.stdout and secret not in table.stdout
    audit = json.loads(cli(cli_env, "audit", "--json", "--token", token_id).stdout)
    assert [
        (e["surface"], e["tool"], e["sessionKey"], e["outcome"], e["status"]) for e in audit
    ] == [
        ("tools", "sessions_list", "agent:alpha:main", "ok", 200),
        ("tools", "sessions_list", "agent:beta:main", "refused", 403),
    ]
    assert cli(cli_env, "token", "revoke", token_id).returncode == 0
    assert invoke(api_url, token, "sessions_list").status_code == 401
    assert cli(cli_env, "token", "revoke", token_id).returncode == 1
    assert json.loads(cli(cli_env, "token", "list", "--json").stdout) == []
    assert cli(cli_env, "token", "create", "--agent", "nobody").returncode == 2
    assert cli(cli_env, "token", "create", "--agent", "alpha", "--tools", "rm_rf").returncode == 2
    assert cli(cli_env, "token", "create", "--agent", "alpha", "--ttl", "soon").returncode == 2


@pytest.fixture
def two_apis(cli_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    """Two `switchboard api` processes on the same Redis."""
    urls, procs = [], []
    for n in range(2):
        port = free_port()
        with (tmp_path / f"api-{n}.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "switchboard", "api", "--port", str(port)],
                    env=cli_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "api did not start"
                time.sleep(0.1)
        yield urls
    finally:
        stop_groups(procs, timeout_s=15)


def test_revoke_on_one_api_holds_on_the_other_at_the_next_request(
    two_apis: list[str], services: Services
) -> None:
    """A token used on both apis, revoked (through the store, as the CLI does) between two
    requests: the very next request on either api, on every surface, is refused."""
    for round_ in range(5):
        token, token_id = issue(services, "alpha")
        first, second = two_apis if round_ % 2 == 0 else two_apis[::-1]
        for url in (first, second):  # each api has seen and accepted the token
            assert invoke(url, token, "session_status").status_code == 200
        assert services.store.tokens.revoke(token_id)
        assert invoke(second, token, "session_status").status_code == 401
        assert rpc(first, token, "chat.history").status_code == 401
        models = httpx.get(f"{second}/v1/models", headers=bearer(token), timeout=10)
        assert models.status_code == 401 and models.json()["error"]["code"] == "invalid_api_key"
        mcp = httpx.post(
            f"{first}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**bearer(token), "accept": "application/json, text/event-stream"},
            timeout=10,
        )
        assert mcp.status_code == 401


def test_audit_stream_is_capped_and_marks_last_use(redis_url: str, services: Services) -> None:
    """The writer trims the stream near its cap (XADD MAXLEN ~) and marks the token's last
    use, but never brings a revoked token's record back."""
    _, token_id = issue(services, "alpha")
    _, gone_id = issue(services, "alpha")
    assert services.store.tokens.revoke(gone_id)

    async def write() -> None:
        client = connect_async(redis_url)
        audit = AsyncAuditStore(client, services.store.ks, maxlen=100)
        try:
            for n in range(1000):
                entry = AuditEntry(
                    token_id=gone_id if n == 999 else token_id,
                    surface="tools",
                    outcome="ok",
                    status=200,
                    at_ms=1_000 + n,
                )
                await audit.record_use(entry)
        finally:
            await client.aclose()

    anyio.run(write)
    assert 100 <= services.store.redis.xlen(services.store.ks.audit) <= 300
    (record,) = services.store.tokens.list()
    assert record.token_id == token_id and record.last_used_at_ms == 1_998
    assert not services.store.redis.exists(services.store.ks.api_token(gone_id))


def test_refusals_name_no_session_the_token_cannot_see(
    api_url: str, services: Services, worker: Any
) -> None:
    """agent.wait on another agent's run reads as an unknown runId; a sessionId of another
    agent's session is refused without naming its key."""
    token = issue(services, "alpha")[0]
    started = rpc(api_url, TOKEN, "agent", sessionKey="agent:beta:hidden", message="work")
    run_id = started.json()["runId"]
    waited = rpc(api_url, token, "agent.wait", runId=run_id, timeoutMs=10)
    unknown = rpc(api_url, token, "agent.wait", runId="run_nosuch", timeoutMs=10)
    assert waited.status_code == unknown.status_code == 404
    assert "hidden" not in waited.text and "beta" not in waited.text
    entry = services.store.sessions.get("agent:beta:hidden")
    assert entry is not None
    session_id = entry.session_id
    refused = rpc(api_url, token, "chat.history", sessionKey=session_id)
    assert refused.status_code in (403, 404)
    assert "hidden" not in refused.text and "agent:beta" not in refused.text
