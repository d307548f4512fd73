"""A guided tour of the session tools, driven through the main agent with the offline model.

Start Switchboard in one terminal, then run this in another:

    switchboard up --config examples/switchboard.json5
    .venv/bin/python examples/walkthrough.py

Every step sends the main agent a message made of `builtin/echo` directives (`/tool <name>
<json>`), so the agent itself calls the tool through tool calling and replies with the tool's
result as JSON. Environment: SWITCHBOARD_URL (default http://127.0.0.1:8780),
SWITCHBOARD_TOKEN (default: ./.switchboard/token), WEBHOOK_PORT (default 8799, must match
`channels.discord.webhook.url` in the config), WALKTHROUGH_TIMEOUT (seconds per wait, 60).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

URL = os.environ.get("SWITCHBOARD_URL", "http://127.0.0.1:8780").rstrip("/")
WEBHOOK_PORT = int(os.environ.get("WEBHOOK_PORT", "8799"))
TIMEOUT_S = float(os.environ.get("WALKTHROUGH_TIMEOUT", "60"))
TARGET = "agent:main:discord:group:ops"

console = Console()


class StepFailed(Exception):
    """A step did not produce what it should have (or not in time)."""


# -- a tiny webhook receiver: stands in for the discord channel ---------------------------


class Receiver:
    """Records the JSON body of every POST to http://127.0.0.1:<port>/hook."""

    def __init__(self, port: int) -> None:
        self.bodies: list[Any] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                with receiver.lock:
                    receiver.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "11")
                self.end_headers()
                self.wfile.write(b'{"ok":true}')

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise StepFailed(f"cannot listen on 127.0.0.1:{port} for the webhook: {exc}") from exc
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[Any]:
        with self.lock:
            return list(self.bodies)


# -- talking to the api -------------------------------------------------------------------


def read_token() -> str:
    token = os.environ.get("SWITCHBOARD_TOKEN")
    if token:
        return token.strip()
    path = Path(".switchboard") / "token"
    if not path.is_file():
        raise StepFailed(
            "no token: set SWITCHBOARD_TOKEN or run from the directory where `switchboard up` "
            "runs (it saves ./.switchboard/token)"
        )
    return path.read_text().strip()


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S + 10
        )

    def rpc(self, method: str, **params: Any) -> Any:
        try:
            resp = self.http.post("/rpc", json={"method": method, "params": params})
        except httpx.HTTPError as exc:
            raise StepFailed(
                f"{method}: cannot reach {URL} ({exc}); is `switchboard up` running?"
            ) from exc
        if resp.status_code != 200:
            raise StepFailed(f"{method} failed: HTTP {resp.status_code} {resp.text}")
        return resp.json()

    def run(self, session_key: str, message: str) -> str:
        """One agent run: send ``message`` to ``session_key``, wait, return the reply."""
        console.print(f"[dim]→ {session_key}:[/] [cyan]{message}[/]")
        started = self.rpc("agent", sessionKey=session_key, message=message)
        outcome = self.rpc("agent.wait", runId=started["runId"], timeoutMs=int(TIMEOUT_S * 1000))
        if outcome.get("status") != "ok":
            raise StepFailed(f"run {started['runId']} ended {outcome.get('status')}: {outcome}")
        return str(outcome.get("reply") or "")

    def tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Ask the main agent to call ``name``; the echo model replies with the result JSON."""
        reply = self.run("main", f"/tool {name} {json.dumps(args)}")
        try:
            result = json.loads(reply)
        except ValueError as exc:
            raise StepFailed(f"{name}: the reply is not a tool result: {reply!r}") from exc
        if result.get("status") in ("error", "forbidden"):
            raise StepFailed(f"{name} returned {result['status']}: {result.get('error')}")
        return dict(result)


def wait_until(what: str, check: Any, interval_s: float = 0.3) -> Any:
    """Poll ``check()`` until it returns something truthy (StepFailed after TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise StepFailed(f"timed out after {TIMEOUT_S:.0f}s waiting for {what}")


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    texts = [
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    ]
    calls = [
        f"{p.get('name')}({json.dumps(p.get('arguments'))})"
        for p in parts
        if isinstance(p, dict) and p.get("type") == "toolCall"
    ]
    return " ".join(texts + calls)


def short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step(number: int, title: str) -> None:
    console.print()
    console.rule(f"[bold]Step {number}: {title}")


def ok(text: str) -> None:
    console.print(f"[green]✔[/] {text}")


# -- the steps ----------------------------------------------------------------------------


def seed(api: Api) -> None:
    step(1, "seed a group session")
    reply = api.run("discord:group:ops", "deploy of v1.4 finished, all green")
    ok(f"{TARGET} replied: {reply!r}")


def list_sessions(api: Api) -> None:
    step(2, "main calls sessions_list")
    result = api.tool("sessions_list", {})
    table = Table("key", "kind", "channel", "status")
    for row in result.get("sessions", []):
        table.add_row(row.get("key"), row.get("kind"), row.get("channel"), row.get("status"))
    console.print(table)
    keys = [row.get("key") for row in result.get("sessions", [])]
    if TARGET not in keys:
        raise StepFailed(f"sessions_list does not show {TARGET}: {keys}")
    ok(f"sessions_list: {result.get('count')} sessions visible")


def read_history(api: Api) -> None:
    step(3, "main calls sessions_history")
    result = api.tool("sessions_history", {"sessionKey": TARGET})
    table = Table("role", "text")
    for message in result.get("messages", []):
        table.add_row(message.get("role"), short(text_of(message)))
    console.print(table)
    if not result.get("messages"):
        raise StepFailed(f"sessions_history of {TARGET} is empty")
    ok(f"sessions_history: {len(result['messages'])} messages of {TARGET}")


def send_and_reply_back(api: Api, receiver: Receiver) -> None:
    step(4, "main calls sessions_send and waits (the run parks, then resumes)")
    before = len(receiver.received())
    result = api.tool(
        "sessions_send", {"sessionKey": TARGET, "message": "status?", "timeoutSeconds": 30}
    )
    if result.get("status") != "ok":
        raise StepFailed(f"sessions_send did not get a reply: {result}")
    ok(f"sessions_send: status ok, the target replied {result.get('reply')!r}")
    flow_id = result["flowId"]
    console.print(f"[dim]reply-back flow {flow_id}: polling flows.get…[/]")

    def settled() -> dict[str, Any] | None:
        flow = api.rpc("flows.get", flowId=flow_id)
        status = flow.get("announce", {}).get("status")
        in_flight = status in ("pending", "delivering", "sending")
        return flow if flow.get("status") == "done" and not in_flight else None

    flow = wait_until("the reply-back loop and its announce", settled)
    table = Table("round", "speaker", "session", "status", "reply")
    for rnd in flow.get("rounds", []):
        table.add_row(
            str(rnd.get("turn")),
            rnd.get("speaker"),
            rnd.get("sessionKey"),
            rnd.get("status"),
            short(str(rnd.get("reply", ""))),
        )
    console.print(table)
    replies = [r for r in flow.get("rounds", []) if r.get("turn", 0) > 0]
    ok(f"reply-back: {len(replies)} rounds after the primary run (stop: {flow.get('stopReason')})")
    announce = flow.get("announce", {})
    if announce.get("status") != "delivered":
        raise StepFailed(f"the announce was not delivered: {announce}")
    got = wait_until("the webhook request", lambda: receiver.received()[before:])
    for body in got:
        console.print(Panel(json.dumps(body, indent=2), title="webhook received"))
    ok(f"announce delivered: {len(got)} webhook request(s), {announce.get('reply')!r}")


def fan_out(api: Api) -> None:
    step(5, "main calls sessions_spawn with three tasks")
    tasks = [{"task": "research A"}, {"task": "research B"}, {"task": "research C"}]
    result = api.tool("sessions_spawn", {"tasks": tasks})
    children = {run["childSessionKey"] for run in result.get("runs", [])}
    for key in sorted(children):
        console.print(f"  spawned {key}")
    if len(children) != 3:
        raise StepFailed(f"expected 3 children, got {result}")

    def announces() -> list[dict[str, Any]] | None:
        messages = api.rpc("chat.history", sessionKey="main", limit=200)["messages"]
        found = [
            m
            for m in messages
            if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
            and (m.get("provenance") or {}).get("sourceSessionKey") in children
        ]
        return found if len(found) >= len(children) else None

    found = wait_until("three sub-agent announces in main's transcript", announces)
    for message in found:
        first_line = text_of(message).splitlines()[0]
        console.print(f"  [magenta]announce[/] {first_line}")
    ok(f"sub-agent announces: {len(found)} in main's transcript")


def main() -> int:
    console.print(Panel(f"Switchboard walkthrough against {URL}", style="bold"))
    try:
        api = Api(URL, read_token())
        receiver = Receiver(WEBHOOK_PORT)
        console.print(f"[dim]webhook receiver on http://127.0.0.1:{WEBHOOK_PORT}/hook[/]")
        seed(api)
        list_sessions(api)
        read_history(api)
        send_and_reply_back(api, receiver)
        fan_out(api)
    except StepFailed as exc:
        console.print(f"\n[bold red]✘ walkthrough failed:[/] {exc}")
        return 1
    console.print("\n[bold green]✔ walkthrough complete[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
