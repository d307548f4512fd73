"""The api client commands: send, spawn, sessions and history over HTTP."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from switchboard.cli.common import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigOpt,
    TokenOpt,
    UrlOpt,
    _api_base,
    _fail,
    _saved_token,
    _settings,
    app,
    console,
)
from switchboard.shared.config import Settings
from switchboard.shared.gateway.params import MAX_MESSAGE_CHARS


class _Client:
    """A small HTTP client for the api, with errors turned into readable messages."""

    def __init__(self, settings: Settings, url: str | None, token: str | None) -> None:
        self.base = _api_base(settings, url)
        tok = token or settings.token or _saved_token(settings.data_dir.resolve(), create=False)
        if not tok:
            _fail(
                "no token",
                "set SWITCHBOARD_TOKEN, pass --token, or run `switchboard up` here",
                EXIT_USAGE,
            )
        self.http = httpx.Client(headers={"Authorization": f"Bearer {tok}"}, timeout=660)

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        """Call one gateway method; a refusal or error exits with its code."""
        return self._post("/rpc", {"method": method, "params": params})

    def invoke(self, tool: str, args: dict[str, Any], session_key: str) -> dict[str, Any]:
        """Invoke one session tool as `session_key`; its result (status included)."""
        body = self._post("/tools/invoke", {"tool": tool, "args": args, "sessionKey": session_key})
        result: dict[str, Any] = body["result"]
        return result

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        try:
            resp = self.http.post(f"{self.base}{path}", json=payload)
        except httpx.HTTPError as exc:
            _fail(
                f"cannot reach the api at {self.base}",
                str(exc) or type(exc).__name__,
                EXIT_UNAVAILABLE,
            )
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code == 200 and body is not None:
            return body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        if not isinstance(error, dict):
            error = {"message": str(error)}
        _fail(
            str(error.get("type") or f"HTTP {resp.status_code}"),
            str(error.get("message") or resp.text),
            _HTTP_EXIT.get(resp.status_code, EXIT_REFUSED),
        )


# Bad requests are usage errors; an unavailable store or a sick api is "unavailable".
_HTTP_EXIT = {
    400: EXIT_USAGE,
    413: EXIT_USAGE,
    422: EXIT_USAGE,
    502: EXIT_UNAVAILABLE,
    503: EXIT_UNAVAILABLE,
    504: EXIT_UNAVAILABLE,
}


def _wait_reply(client: _Client, run_id: str, timeout_s: float) -> None:
    """Wait for a run's outcome: print its reply, or its reason on stderr and exit 1."""
    outcome = client.rpc("agent.wait", {"runId": run_id, "timeoutMs": int(timeout_s * 1000)})
    status = str(outcome.get("status", "error"))
    if status == "ok":
        console.print(outcome.get("reply", ""), markup=False)
        return
    reason = str(outcome.get("error") or "")
    if not reason and status == "timeout":
        reason = (
            f"no reply within {timeout_s:g} s (the run goes on; raise --timeout to wait longer)"
        )
    _fail(status, f"run {run_id}: {reason or 'no reason given'}", EXIT_REFUSED)


@app.command()
def send(
    session: Annotated[str, typer.Argument(help="Session key, `main`, or a sessionId.")],
    message: Annotated[str, typer.Argument(help="The message; `-` reads it from stdin.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the reply; 0 = don't.")] = 30,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a message into a session and print the reply."""
    if message == "-":
        message = _stdin_message()
    client = _Client(_settings(config), url, token)
    started = client.rpc("agent", {"sessionKey": session, "message": message})
    run_id = started["runId"]
    if timeout <= 0:
        console.print(f"accepted run {run_id}", markup=False)
        return
    _wait_reply(client, run_id, timeout)


def _stdin_message() -> str:
    """The message piped to `send SESSION -`, refused in one line past the message limit."""
    text = sys.stdin.read(MAX_MESSAGE_CHARS + 1)
    if len(text) > MAX_MESSAGE_CHARS:
        _fail(
            "message too long",
            f"stdin holds more than {MAX_MESSAGE_CHARS:,} characters, the limit of one message",
            EXIT_USAGE,
        )
    if not text.strip():
        _fail("empty message", "stdin held no message", EXIT_USAGE)
    return text


@app.command()
def spawn(
    task: Annotated[str, typer.Argument(help="What the sub-agent should do.")],
    session: Annotated[
        str, typer.Option("--session", help="The requester session (key, `main`, or sessionId).")
    ] = "main",
    agent: Annotated[str | None, typer.Option(help="Spawn under this agentId.")] = None,
    label: Annotated[str | None, typer.Option(help="A short name for the child session.")] = None,
    model: Annotated[str | None, typer.Option(help="Model override, provider/model.")] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the child's reply; 0 = don't.")
    ] = 0,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Spawn a sub-agent for a session; its result is announced back to that session."""
    client = _Client(_settings(config), url, token)
    args: dict[str, Any] = {"task": task}
    for name, value in (("agentId", agent), ("label", label), ("model", model)):
        if value is not None:
            args[name] = value
    result = client.invoke("sessions_spawn", args, session)
    if result.get("status") != "accepted":
        _fail(str(result.get("status", "error")), str(result.get("error", result)), EXIT_REFUSED)
    console.print(f"spawned {result['childSessionKey']} (run {result['runId']})", markup=False)
    if timeout > 0:
        _wait_reply(client, result["runId"], timeout)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the api's JSON answer as is.")]


@app.command()
def sessions(
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    active_minutes: Annotated[int | None, typer.Option(min=1)] = None,
    kinds: Annotated[
        list[str] | None,
        typer.Option(
            "--kinds",
            help="Only these kinds: main, group, cron, hook, node, other "
            "(repeatable or comma-separated).",
        ),
    ] = None,
    label: Annotated[
        str | None, typer.Option("--label", help="Only the session with this label.")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only sessions of this agent id.")
    ] = None,
    search: Annotated[
        str | None,
        typer.Option(
            "--search", help="Only sessions whose key, label, name or id contains this text."
        ),
    ] = None,
    wide: Annotated[
        bool,
        typer.Option("--wide", help="Never truncate keys (the default into a pipe)."),
    ] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List sessions, newest first."""
    client = _Client(_settings(config), url, token)
    params: dict[str, Any] = {"limit": limit}
    if active_minutes:
        params["activeMinutes"] = active_minutes
    for name, value in (("label", label), ("agentId", agent), ("search", search)):
        if value:
            params[name] = value
    wanted = [k.strip() for item in kinds or [] for k in item.split(",") if k.strip()]
    if wanted:
        params["kinds"] = wanted
    listing = client.rpc("sessions.list", params)
    if as_json:
        _print_json(listing)
        return
    # Into a pipe (grep, a file) keys go whole: a cut key cannot be found or pasted.
    table = _sessions_table(
        listing["sessions"], wide=wide or not console.is_terminal, width=console.width
    )
    console.print(table)
    console.print(f"{listing['count']} session(s)", markup=False)


def _sessions_table(rows: list[dict[str, Any]], *, wide: bool, width: int | None = None) -> Table:
    """The sessions as a table, one line a session. With ``wide`` every cell is whole (the
    table may pass the screen's edge); else, in ``width`` columns, kind, channel, time,
    tokens and status stay whole, the key is cut in its middle (its start and its
    distinctive end kept) and the model at its end, with `…`, when they must."""
    from datetime import UTC, datetime

    headers = ("key", "kind", "channel", "updated", "model", "tokens", "status")
    table = Table(*headers)
    cells = [
        (
            str(row["key"]),
            str(row.get("kind", "")),
            _delivery_channel(row),
            datetime.fromtimestamp(row.get("updatedAt", 0) / 1000, UTC).strftime(
                "%Y-%m-%d %H:%M:%S"
            ),
            str(row.get("model", "")),
            str(row.get("totalTokens", "")),
            str(row.get("status", "")),
        )
        for row in rows
    ]
    longest = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    for index, column in enumerate(table.columns):
        column.no_wrap = True
        column.min_width = longest[index]
    borders = 3 * len(headers) + 1  # a space each side of a cell, a line between and around
    if wide or width is None or sum(longest) + borders <= width:
        table.width = sum(longest) + borders  # every cell whole, past the edge if need be
    else:
        # What the short columns leave to key and model; the model gets a quarter at most.
        room = width - borders - sum(longest[1:4]) - sum(longest[5:])
        model = min(longest[4], max(len(headers[4]), room // 4))
        key = max(len(headers[0]), room - model)
        table.columns[0].min_width = table.columns[0].width = key
        table.columns[4].min_width = table.columns[4].width = model
        cells = [(_middle_cut(line[0], key), *line[1:]) for line in cells]
    for line in cells:
        table.add_row(*(escape(cell) for cell in line))
    return table


def _middle_cut(text: str, width: int) -> str:
    """``text`` in ``width`` characters: whole when it fits, else its start, `…` and its
    end, the end given two thirds (where sub-agent and thread keys differ)."""
    if len(text) <= width:
        return text
    tail = (width - 1) * 2 // 3
    return f"{text[: width - 1 - tail]}…{text[len(text) - tail :]}"


def _delivery_channel(row: dict[str, Any]) -> str:
    """Where the session's replies go: its delivery route, else its last or own channel."""
    route = row.get("deliveryContext")
    channel = route.get("channel") if isinstance(route, dict) else None
    channel = channel or row.get("lastChannel") or row.get("channel")
    return str(channel) if channel and channel != "unknown" else "-"


def _print_json(value: Any) -> None:
    """JSON on stdout, unstyled and unwrapped (for jq and scripts)."""
    import json

    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


@app.command()
def history(
    session: Annotated[str, typer.Argument(help="Session key, `main`, or a sessionId.")],
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a session's transcript."""
    client = _Client(_settings(config), url, token)
    result = client.rpc("chat.history", {"sessionKey": session, "limit": limit})
    if "sessionId" not in result and not result.get("messages"):
        # The api answers an empty transcript for a key it never saw: say so, exit 1.
        _fail("not found", f"no session {result.get('sessionKey', session)}", EXIT_REFUSED)
    if as_json:
        _print_json(result)
        return
    for msg in result["messages"]:
        role = msg.get("role", "?")
        colour = {"user": "cyan", "assistant": "green", "toolResult": "yellow"}.get(role, "white")
        console.print(f"[bold {colour}]{escape(str(role))}[/]: ", end="")
        console.print(_message_text(msg), markup=False)


def _message_text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "toolCall":
            parts.append(f"[tool call {block.get('name')} {block.get('arguments')}]")
        elif block.get("type") == "thinking":
            parts.append(f"[thinking] {block.get('thinking', '')}")
    return "\n".join(parts)
