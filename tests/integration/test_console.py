"""The web console in headless Chromium against the real api and a real worker: sign-in,
filters, provenance marks, the spawn tree, the reply-back timeline, delivery outcomes, a send
whose reply arrives over /events without a reload, and screenshots that show data."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from switchboard.shared.config import Settings
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OPS = "agent:ops:discord:group:ops"
MAIN = "agent:main:main"
# Playwright's waits: generous for a loaded 2-core machine, still far below the test timeout.
WAIT_MS = 20_000
expect.set_options(timeout=WAIT_MS)


@pytest.fixture
def config_data(webhook: WebhookReceiver) -> dict[str, Any]:
    """Two agents that may talk to each other, two reply-back rounds, a discord webhook."""
    return {
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops"}]},
        "tools": {"sessions": {"visibility": "all"}, "agentToAgent": {"enabled": True}},
        "session": {"agentToAgent": {"maxPingPongTurns": 2}},
        "channels": {"discord": {"webhook": {"url": webhook.url}}},
        "delivery": {"maxAttempts": 3, "backoffBaseS": 0.2, "backoffMaxS": 1, "timeoutS": 2},
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless (never a downloaded browser)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the console tests need Debian's Chromium. Install it "
            "with `make browser` (or `sudo apt-get install chromium`).",
            pytrace=False,
        )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, api_url: str) -> Iterator[Page]:
    """A fresh browser context (empty localStorage, no cookies) with a wide viewport."""
    context = browser.new_context(base_url=api_url, viewport={"width": 1400, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def seeded(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], webhook: WebhookReceiver
) -> dict[str, Any]:
    """A group session of `ops`, a waiting send from main with reply-back and a webhook
    announce, and a sub-agent spawned by main; returns the ids, once everything settled."""
    seed = rpc("agent", sessionKey=OPS, message="deploy of v1.4 finished")
    assert rpc("agent.wait", runId=seed["runId"], timeoutMs=20_000)["status"] == "ok"
    sent = _invoke(client, "sessions_send", sessionKey=OPS, message="status report please")
    assert sent["status"] == "ok", sent
    flow = _poll(lambda: _settled_flow(rpc, sent["flowId"]), "the reply-back flow")
    assert flow["announce"]["delivery"]["status"] == "delivered"
    spawned = _invoke(client, "sessions_spawn", task="summarize the logs", label="summarizer")
    assert spawned["status"] == "accepted", spawned
    child = spawned["childSessionKey"]
    _poll(lambda: rpc("deliveries.list", sessionKey="main")["count"] > 0, "the spawn announce")
    webhook.wait_for(1)
    return {"flowId": sent["flowId"], "child": child}


def _invoke(client: httpx.Client, tool: str, **args: Any) -> dict[str, Any]:
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": MAIN})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def _settled_flow(rpc: Callable[..., Any], flow_id: str) -> dict[str, Any] | None:
    flow: dict[str, Any] = rpc("flows.get", flowId=flow_id)
    delivery = flow.get("announce", {}).get("delivery") or {}
    done = flow["status"] == "done" and delivery.get("status") in ("delivered", "failed")
    return flow if done else None


def _poll(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def sign_in(page: Page, token: str) -> None:
    """Open the api root, get redirected to the console, sign in with the token."""
    page.goto("/")
    assert page.url.endswith("/console")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#app")).to_be_hidden()
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#login")).to_be_hidden()
    expect(page.locator("#live")).to_have_text("live")


def session_rows(page: Page) -> list[str]:
    """The keys in the sessions table, top to bottom."""
    keys: list[str] = page.locator("#sessions tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.key)"
    )
    return keys


def test_console_shows_sessions_flows_deliveries_and_live_replies(
    page: Page, seeded: dict[str, Any], settings: Settings
) -> None:
    """The whole console journey, against data made by a real worker."""
    assert settings.token
    page.goto("/console")
    page.fill("#token", "wrong-token")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("Sign-in failed")
    sign_in(page, settings.token)
    stored = page.evaluate("JSON.stringify(localStorage)")
    assert settings.token not in stored and "sbs_" in stored, "only the session is kept"
    child = seeded["child"]
    expect(page.locator(f'#sessions tr[data-key="{child}"]')).to_be_visible()
    assert {MAIN, OPS, child} <= set(session_rows(page))

    # Filters: kind, then agent, then a search; back to everything.
    page.select_option("#filter-kind", "group")
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    assert session_rows(page) == [OPS]
    page.select_option("#filter-kind", "")
    page.fill("#filter-agent", "main")
    page.click("#filters button[type=submit]")
    expect(page.locator(f'#sessions tr[data-key="{OPS}"]')).to_have_count(0)
    assert {MAIN, child} <= set(session_rows(page))
    page.fill("#filter-agent", "")
    page.fill("#filter-search", "summarizer")
    page.click("#filters button[type=submit]")
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    assert session_rows(page) == [child]
    page.fill("#filter-search", "")
    page.click("#filters button[type=submit]")
    expect(page.locator(f'#sessions tr[data-key="{OPS}"]')).to_be_visible()

    # The target's transcript marks the routed message as inter-session, from main.
    page.click(f'#sessions tr[data-key="{OPS}"]')
    expect(page.locator("#detail-title")).to_have_text(OPS)
    # The primary run's message (the announce run's prompt quotes the request again).
    routed = page.locator("#transcript li.inter-session", has_text="status report please").first
    mark = routed.locator(".provenance")
    expect(mark).to_have_text(f"from {MAIN} via sessions_send")
    assert mark.get_attribute("data-source") == MAIN
    typed = page.locator("#transcript li.role-user", has_text="deploy of v1.4 finished")
    expect(typed.locator(".provenance")).to_have_count(0)

    # Its reply-back flow: the rounds, then the announce and its delivered webhook POST.
    flow = page.locator(f'#flows .flow[data-flow="{seeded["flowId"]}"]')
    expect(flow.locator(".step-round")).to_have_count(3)
    expect(flow.locator(".step-announce .badge")).to_have_text("delivered")
    expect(flow.locator(".step-delivery")).to_contain_text("delivery to discord")
    delivery = page.locator("#deliveries tbody tr[data-status=delivered]")
    expect(delivery).to_have_count(1)
    expect(delivery).to_contain_text("discord")

    # main: the spawn tree shows the sub-agent; clicking it opens the child with its parent.
    page.click(f'#sessions tr[data-key="{MAIN}"]')
    expect(page.locator("#detail-title")).to_have_text(MAIN)
    node = page.locator(f'#tree li[data-key="{child}"]')
    expect(node).to_contain_text("summarizer")
    node.locator("a").first.click()
    expect(page.locator("#detail-title")).to_have_text(child)
    expect(page.locator("#tree")).to_contain_text(f"spawned by {MAIN}")
    expect(page.locator("#transcript .provenance").first).to_contain_text("via sessions_spawn")

    # A message from the send box: the reply appears through /events, without a reload.
    page.click(f'#sessions tr[data-key="{MAIN}"]')
    expect(page.locator("#detail-title")).to_have_text(MAIN)
    page.evaluate("window.__sameDocument = true")
    page.fill("#send-text", "hello from the console")
    page.click("#send-form button[type=submit]")
    reply = page.locator("#transcript li.role-assistant", has_text="hello from the console")
    expect(reply).to_have_count(1)
    expect(page.locator("#send-status")).to_contain_text("reply received (ok)")
    expect(page.locator('#event-log li[data-type="run.ended"]').first).to_contain_text(MAIN)
    assert page.evaluate("window.__sameDocument") is True


def test_console_screenshots_show_data(
    page: Page, seeded: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    """Screenshots of the sessions table and a session's detail are PNGs full of content."""
    assert settings.token
    sign_in(page, settings.token)
    expect(page.locator(f'#sessions tr[data-key="{seeded["child"]}"]')).to_be_visible()
    assert set(session_rows(page)) == {MAIN, OPS, seeded["child"]}
    table_png = tmp_path / "sessions.png"
    page.screenshot(path=str(table_png), full_page=True)
    page.click(f'#sessions tr[data-key="{OPS}"]')
    expect(page.locator("#flows .flow")).to_have_count(1)
    detail_png = tmp_path / "detail.png"
    page.screenshot(path=str(detail_png), full_page=True)
    for png in (table_png, detail_png):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), png
        stats = _pixel_stats(page, data)
        assert stats["width"] >= 1200 and stats["height"] >= 600, stats
        # A blank or single-colour page has ~1 colour and no ink; this one has text and badges.
        assert stats["colors"] >= 50, stats
        assert stats["inked"] >= 0.02, stats


def _pixel_stats(page: Page, png: bytes) -> dict[str, float]:
    """Decode the PNG in the browser: size, distinct colours, share of non-background pixels."""
    script = """async (b64) => {
      const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
      const bitmap = await createImageBitmap(new Blob([bytes], {type: "image/png"}));
      const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
      const ctx = canvas.getContext("2d");
      ctx.drawImage(bitmap, 0, 0);
      const px = ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
      const counts = new Map();
      for (let i = 0; i < px.length; i += 4) {
        const key = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
        counts.set(key, (counts.get(key) || 0) + 1);
      }
      const total = px.length / 4;
      const background = Math.max(...counts.values());
      return {width: bitmap.width, height: bitmap.height, colors: counts.size,
              inked: 1 - background / total};
    }"""
    stats: dict[str, float] = page.evaluate(script, base64.b64encode(png).decode())
    return stats
