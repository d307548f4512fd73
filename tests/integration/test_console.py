"""The web console in headless Chromium against the real api and a real worker: sign-in,
filters, provenance marks, the spawn tree, the reply-back timeline, delivery outcomes, a send
whose reply arrives over /events without a reload, and screenshots that show data."""

from __future__ import annotations

import base64
import json
import re
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
    """Two agents that may talk to each other, two reply-back rounds, a discord webhook,
    sub-agents that may spawn their own."""
    return {
        "agents": {
            "list": [{"id": "main", "default": True}, {"id": "ops"}],
            "defaults": {"subagents": {"maxSpawnDepth": 2}},
        },
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


def _invoke(client: httpx.Client, tool: str, *, caller: str = MAIN, **args: Any) -> dict[str, Any]:
    body = {"tool": tool, "args": args, "sessionKey": caller}
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def _settled_flow(rpc: Callable[..., Any], flow_id: str) -> dict[str, Any] | None:
    flow: dict[str, Any] = rpc("flows.get", flowId=flow_id)
    delivery = flow.get("announce", {}).get("delivery") or {}
    done = flow["status"] == "done" and delivery.get("status") in ("delivered", "failed")
    return flow if done else None


def _all_idle(rpc: Callable[..., Any]) -> bool:
    rows = rpc("sessions.list", limit=100)["sessions"]
    return all(row.get("status") not in ("queued", "running", "parked") for row in rows)


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
    # Its completion delivery, in OpenClaw 2026.9.6's vocabulary (its webhook POST was seen).
    expect(node.locator(".badge.delivery").first).to_have_text(re.compile(r"^(pending|delivered)$"))
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


# Sessions whose keys share a long prefix and differ only at the end; the last one's final
# segment alone is wider than the key column at 1400 px.
GROUP = "agent:main:discord:group:"
GROUPS = [
    GROUP + "release-planning",
    GROUP + "incident-review-eu-west",
    GROUP + "customer-escalations-tier-2",
    "agent:main:discord:channel:1184629577392748564:thread:1299845211098767431",
    GROUP + "quarterly-business-review-and-planning-offsite-logistics-2027",
]
# Up to this length a key's last segment (a uuid is 36) is drawn whole whatever the width.
WHOLE_SEGMENT = 40


@pytest.fixture
def crowded(worker: Any, client: httpx.Client, rpc: Callable[..., Any]) -> dict[str, Any]:
    """The group sessions above, two sub-agents of main (uuid keys, labels) and a sub-agent
    of the first one; returns the keys once every run has ended."""
    runs = [rpc("agent", sessionKey=key, message="hello group")["runId"] for key in GROUPS]
    first = _invoke(client, "sessions_spawn", task="triage the alerts", label="alert-triage")
    second = _invoke(client, "sessions_spawn", task="draft the notes", label="release-notes")
    child = first["childSessionKey"]
    nested = _invoke(
        client, "sessions_spawn", caller=child, task="dig into eu-west", label="eu-west-dig"
    )
    assert nested["status"] == "accepted", nested
    runs += [first["runId"], second["runId"], nested["runId"]]
    for run_id in runs:
        assert rpc("agent.wait", runId=run_id, timeoutMs=20_000)["status"] == "ok"
    _poll(lambda: _all_idle(rpc), "every run (announces included) to end")
    return {
        "child": child,
        "sibling": second["childSessionKey"],
        "grandchild": nested["childSessionKey"],
    }


# Measured in the page: what of a text is drawn (characters inside every box that clips them
# horizontally; "…" where some are not), what is cut, how tall the spawn-tree lines are.
LAYOUT_PROBE = """() => {
  const clippers = (node) => {
    const boxes = [];
    for (let a = node.parentElement; a; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === "visible") continue;
      const r = a.getBoundingClientRect();
      let right = r.left + a.clientLeft + a.clientWidth;
      const style = getComputedStyle(a);
      let left = r.left + a.clientLeft;
      if (style.textOverflow === "ellipsis" && a.scrollWidth > a.clientWidth) {
        const ctx = document.createElement("canvas").getContext("2d");
        ctx.font = style.font;
        const mark = ctx.measureText("…").width;
        if (style.direction === "rtl") left += mark;
        else right -= mark;
      }
      boxes.push({ left, right });
    }
    return boxes;
  };
  const drawn = (root) => {
    let out = "";
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      const boxes = clippers(t);
      for (let i = 0; i < t.length; i++) {
        range.setStart(t, i);
        range.setEnd(t, i + 1);
        const r = range.getBoundingClientRect();
        const seen = boxes.every((b) => r.left >= b.left - 0.5 && r.right <= b.right + 0.5);
        if (seen) out += t.data[i];
        else if (t.data[i].trim() && !out.endsWith("…")) out += "…";
      }
    }
    return out;
  };
  const clipped = (node) => {
    const r = node.getBoundingClientRect();
    if (!r.width) return null;
    const inline = getComputedStyle(node).display === "inline";
    if (!inline && node.scrollWidth > node.clientWidth) return "its own box";
    for (let a = node.parentElement; a; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === "visible") continue;
      const b = a.getBoundingClientRect();
      const left = b.left + a.clientLeft;
      if (r.left < left - 0.5 || r.right > left + a.clientWidth + 0.5) {
        return a.id || a.className || a.tagName;
      }
    }
    return null;
  };
  const box = (id) => document.getElementById(id).getBoundingClientRect();
  const cut = [...document.querySelectorAll(
    "#app .badge, #app time, #sessions td:not(:first-child), #sessions th")]
    .map((node) => ({ text: node.textContent, by: clipped(node) }))
    .filter((c) => c.by);
  const rows = [...document.querySelectorAll("#sessions tbody tr")].map((tr) => {
    const keyEl = tr.cells[0].querySelector(".session-key");
    return { key: tr.dataset.key, title: keyEl.title, text: keyEl.textContent,
             drawn: drawn(keyEl) };
  });
  const tree = [...document.querySelectorAll("#tree li[data-key]")].map((li) => {
    const line = li.firstElementChild;
    const link = line.querySelector("a");
    const style = getComputedStyle(line);
    const lineHeight = parseFloat(style.lineHeight) || 1.2 * parseFloat(style.fontSize);
    return { key: li.dataset.key, text: link.textContent, title: link.title,
             drawnKey: drawn(link), drawn: drawn(line),
             height: line.getBoundingClientRect().height, lineHeight };
  });
  const pane = box("sessions-pane");
  return { pane: { width: pane.width, bottom: pane.bottom }, detail: box("detail"),
           pageOverflow: document.documentElement.scrollWidth - innerWidth,
           tableOverflow: document.querySelector(".table-scroll").scrollWidth
             - document.querySelector(".table-scroll").clientWidth,
           cut, rows, tree };
}"""

# Select the drawn end of a key in the table, copy it as a person would: what lands on the
# clipboard.
COPY_PROBE = """(key) => {
  const row = [...document.querySelectorAll("#sessions tbody tr")].find(
    (tr) => tr.dataset.key === key);
  const keyEl = row.cells[0].querySelector(".session-key");
  const range = document.createRange();
  range.selectNodeContents(keyEl.lastChild);
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  const data = new DataTransfer();
  const event = new ClipboardEvent("copy", { clipboardData: data, bubbles: true,
                                            cancelable: true });
  keyEl.lastChild.parentElement.dispatchEvent(event);
  getSelection().removeAllRanges();
  return { selected: range.toString(), copied: data.getData("text/plain") };
}"""


def _check_layout(page: Page, tree_labels: dict[str, str]) -> dict[str, Any]:
    """Measure the page and assert the sessions table, badges, times and spawn tree fit."""
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => done()))")
    probe: dict[str, Any] = page.evaluate(LAYOUT_PROBE)
    assert probe["cut"] == [], probe["cut"]
    assert probe["pageOverflow"] <= 0 and probe["tableOverflow"] <= 0, probe
    for row in probe["rows"]:
        key, drawn = row["key"], row["drawn"]
        assert row["title"] == key and row["text"] == key, row
        # The drawn text is the key with parts of it replaced by "…"; the end always shows.
        pieces = drawn.split("…")
        assert key.startswith(pieces[0]) and key.endswith(pieces[-1]), row
        assert all(piece in key for piece in pieces) and len(pieces) <= 3, row
        last = key.rsplit(":", 1)[-1]
        if len(last) <= WHOLE_SEGMENT:
            assert drawn.endswith(last) and last in pieces[-1], row
        else:
            assert len(pieces[-1]) >= 24, row
    for node in probe["tree"]:
        key = node["key"]
        last = key.rsplit(":", 1)[-1]
        assert node["text"] == last and node["title"] == key, node
        # The last segment, or its end (a uuid's last 8 digits at least) after "…".
        shown = node["drawnKey"]
        assert shown == last or (shown[0] == "…" and last.endswith(shown[1:])), node
        assert len(shown) >= min(len(last), 9), node
        assert node["height"] < 1.6 * node["lineHeight"], node
        if key in tree_labels:
            assert tree_labels[key] in node["drawn"], node
    return probe


def _screenshot(page: Page, path: Path, min_width: int) -> None:
    """Save a full-page screenshot and check it is a PNG full of content."""
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), path
    stats = _pixel_stats(page, data)
    assert stats["width"] >= min_width and stats["colors"] >= 50, stats
    assert stats["inked"] >= 0.02, stats


def test_console_uses_the_width_at_1400_and_800_px(
    page: Page, crowded: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    """Keys keep their end, badges and times are whole, tree nodes one line: at 1400 and 800 px."""
    assert settings.token
    child, sibling, grandchild = crowded["child"], crowded["sibling"], crowded["grandchild"]
    labels = {child: "alert-triage", sibling: "release-notes", grandchild: "eu-west-dig"}
    sign_in(page, settings.token)
    for key in [*GROUPS, grandchild]:
        expect(page.locator(f'#sessions tr[data-key="{key}"]')).to_be_visible()

    # 1400 px: a wide sessions pane; the tree of main, then a grandchild's transcript.
    page.click(f'#sessions tr[data-key="{MAIN}"]')
    expect(page.locator(f'#tree li[data-key="{grandchild}"]')).to_contain_text("eu-west-dig")
    expect(page.locator("#transcript .provenance").first).to_be_visible()
    _screenshot(page, tmp_path / "wide-main.png", 1400)
    wide = _check_layout(page, labels)
    assert wide["pane"]["width"] > 480, wide["pane"]
    assert {*GROUPS, MAIN, child, sibling, grandchild} <= {r["key"] for r in wide["rows"]}
    assert len(wide["tree"]) == 4, wide["tree"]
    assert any("…" in row["drawn"] for row in wide["rows"]), wide["rows"]
    copied = page.evaluate(COPY_PROBE, GROUPS[-1])
    assert copied == {"selected": f":{GROUPS[-1].rsplit(':', 1)[-1]}", "copied": GROUPS[-1]}
    page.click(f'#sessions tr[data-key="{grandchild}"]')
    expect(page.locator("#transcript .provenance").first).to_contain_text(f"from {child}")
    expect(page.locator("#tree")).to_contain_text(f"spawned by {child}")
    _screenshot(page, tmp_path / "wide-grandchild.png", 1400)
    _check_layout(page, labels)

    # 800 px: the panes stack, one column as wide as the window; a long key is cut in the middle.
    page.set_viewport_size({"width": 800, "height": 900})
    _screenshot(page, tmp_path / "narrow-grandchild.png", 800)
    narrow = _check_layout(page, labels)
    assert narrow["detail"]["top"] >= narrow["pane"]["bottom"], narrow
    assert narrow["pane"]["width"] > 700, narrow["pane"]
    assert any("…" in r["drawn"] for r in narrow["rows"]), narrow["rows"]
    page.click(f'#sessions tr[data-key="{MAIN}"]')
    expect(page.locator(f'#tree li[data-key="{grandchild}"]')).to_be_visible()
    _screenshot(page, tmp_path / "narrow-main.png", 800)
    _check_layout(page, labels)


def test_console_lists_batches_with_their_progress(
    worker: Any, page: Page, client: httpx.Client, settings: Settings
) -> None:
    """The console lists the Batches API batches, newest first, with status and progress."""
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "switchboard/main", "messages": [{"role": "user", "content": "hi"}]},
    }
    data = "".join(json.dumps({**line, "custom_id": f"c{i}"}) + "\n" for i in range(3))
    uploaded = client.post(
        "/v1/files", files={"file": ("in.jsonl", data.encode())}, data={"purpose": "batch"}
    ).json()
    batch = client.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    _poll(
        lambda: client.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed",
        "the batch",
    )
    sign_in(page, str(settings.token))
    row = page.locator(f"#batches tr[data-batch='{batch['id']}']")
    expect(row).to_contain_text("completed")
    expect(row).to_contain_text("3/3")
    expect(row).to_contain_text("/v1/chat/completions")
