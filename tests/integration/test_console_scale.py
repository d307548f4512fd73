"""The web console in headless Chromium with real volumes loaded through the store (10,000
sessions, 1,000 spawned children, 10,000 deliveries): panels scroll inside the screen at
1280x800 and 1920x1080, long values truncate and open with a click, relative times tick,
the URL hash is the view (reload, back/forward, an edited hash), the favicon needs no token."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright
from redis.typing import EncodableT, FieldT

from switchboard.shared.config import Settings
from switchboard.shared.keys import session_kind
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard_testkit.bulk import BulkLoader, SessionRow

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
WAIT_MS = 20_000
expect.set_options(timeout=WAIT_MS)
MAIN = "agent:main:main"
SESSIONS = 10_000
CHILDREN = 1_000
DELIVERIES = 10_000
# Keys and bodies longer than any column: they must truncate, never widen the page.
LONG = "x" * 300
LONG_CHILD = f"agent:main:subagent:{'very-long-child-name-' * 12}0"
SIZES: list[ViewportSize] = [{"width": 1280, "height": 800}, {"width": 1920, "height": 1080}]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing (`make browser`)", pytrace=False)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def loaded(services: Services) -> dict[str, float]:
    """The volumes above, written pipelined through the store; returns the load time."""
    started = time.monotonic()
    store = services.store
    store.sessions.ensure(MAIN)
    bulk = BulkLoader(store.redis, store.ks)
    template = bulk.session_fields(MAIN)
    now = int(time.time() * 1000)
    bulk.write_sessions(template, _group_rows(now), advance=lambda _n: None)
    children = _child_keys()
    spawned = {**template, "spawnedBy": MAIN, "label": ""}
    bulk.write_sessions(spawned, _child_rows(children, now), advance=lambda _n: None)
    _write_children_index(store, children, now)
    _write_deliveries(store, now)
    return {"load_s": time.monotonic() - started}


def _group_rows(now: int) -> list[SessionRow]:
    rows = []
    for i in range(SESSIONS - CHILDREN - 1):
        key = f"agent:main:discord:group:g{i:05d}" + (f"-{LONG}" if i % 97 == 0 else "")
        rows.append(SessionRow(key, "main", "group", f"sid-g{i}", now, now - 1000 * i, "group"))
    return rows


def _child_keys() -> list[str]:
    return [LONG_CHILD, *(f"agent:main:subagent:c{i:04d}" for i in range(1, CHILDREN))]


def _child_rows(children: list[str], now: int) -> list[SessionRow]:
    return [
        SessionRow(key, "main", session_kind(key), f"sid-c{i}", now, now - 500 * i, "direct")
        for i, key in enumerate(children)
    ]


def _write_children_index(store: Store, children: list[str], now: int) -> None:
    store.redis.zadd(store.ks.children(MAIN), {key: now + i for i, key in enumerate(children)})


def _write_deliveries(store: Store, now: int) -> None:
    """Delivery hashes as the delivery scripts leave them, indexed under main."""
    pipe = store.redis.pipeline(transaction=False)
    index: dict[str, int] = {}
    for i in range(DELIVERIES):
        delivery_id = f"d{i:05d}"
        fields: dict[FieldT, EncodableT] = {
            "deliveryId": delivery_id,
            "sessionKey": MAIN,
            "channel": "discord",
            "to": f"channel:{i}-{LONG}",
            "status": ("delivered", "failed", "pending")[i % 3],
            "attempts": str(1 + i % 3),
            "message": f"report {i}: " + "word " * 200,
            "lastError": "" if i % 3 != 1 else f"HTTP 500 from {LONG}",
            "createdAt": str(now - i),
            "updatedAt": str(now - i),
        }
        pipe.hset(store.ks.delivery(delivery_id), mapping=fields)
        index[delivery_id] = now - i
    pipe.zadd(store.ks.session_deliveries(MAIN), index)
    pipe.execute()


@pytest.fixture
def signed_in(
    browser: Browser, api_url: str, settings: Settings, loaded: dict[str, float]
) -> Iterator[Page]:
    """A console page signed in over the loaded data (the token kept in localStorage)."""
    context = browser.new_context(base_url=api_url, viewport=SIZES[0])
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto("/console")
    assert settings.token
    page.fill("#token", settings.token)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#app")).to_be_visible()
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _fits(page: Page) -> dict[str, Any]:
    """The page's width against the viewport, and its height against twice the viewport."""
    box: dict[str, Any] = page.evaluate(
        """() => ({scrollWidth: document.documentElement.scrollWidth, innerWidth,
                   scrollHeight: document.documentElement.scrollHeight, innerHeight})"""
    )
    return box


def _open_view(page: Page, hash_: str) -> None:
    """Go to a view by its URL and wait until it has drawn (the spawn tree comes last)."""
    page.goto(f"/console{hash_}")
    expect(page.locator("#sessions tbody tr")).to_have_count(50)
    key = dict(parse_qsl(hash_.lstrip("#"))).get("session")
    if key:
        expect(page.locator("#detail-title")).to_have_text(key)
        expect(page.locator(f"#tree li[data-key={json.dumps(key)}]")).to_have_count(1)


VIEWS = {
    "sessions": "",
    "sessions page 3 of the groups": "#kind=group&page=3",
    "main: spawn tree and deliveries": f"#session={MAIN}",
    "a child with a long key": "#session=" + LONG_CHILD,
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_each_view_fits_the_screen_with_real_volumes(
    signed_in: Page, loaded: dict[str, float], size: ViewportSize
) -> None:
    """No view overflows sideways or grows past twice the screen's height."""
    assert loaded["load_s"] < 20, loaded
    page = signed_in
    page.set_viewport_size(size)
    for name, hash_ in VIEWS.items():
        _open_view(page, hash_)
        box = _fits(page)
        assert box["scrollWidth"] <= box["innerWidth"], (name, box)
        assert box["scrollHeight"] <= 2 * box["innerHeight"], (name, box)
    # The main view really holds the volumes: a paged table, capped panels.
    _open_view(page, f"#session={MAIN}")
    expect(page.locator("#deliveries tbody tr")).to_have_count(200)
    expect(page.locator("#tree li.more")).to_have_count(1)
    expect(page.locator("#sessions-count")).to_contain_text("1\u201350 of 1000")


def test_a_long_value_opens_whole_with_one_click(signed_in: Page, loaded: dict[str, float]) -> None:
    """A delivery's message shows one line; a click shows the whole text, wrapped."""
    page = signed_in
    _open_view(page, f"#session={MAIN}")
    cell = page.locator("#deliveries tbody tr").first.locator(".trunc.message")
    closed = cell.bounding_box()
    assert closed is not None
    cell.click()
    expect(cell).to_have_class("trunc message open")
    opened = cell.bounding_box()
    assert opened is not None and opened["height"] > 3 * closed["height"], (closed, opened)
    assert cell.text_content() == "report 0: " + "word " * 200


def test_the_url_is_the_view(signed_in: Page, loaded: dict[str, float]) -> None:
    """A deep link survives a reload; back/forward and an edited hash change the view."""
    page = signed_in
    link = f"#session={LONG_CHILD}&kind=group&page=2"
    _open_view(page, link)
    page.reload()
    expect(page.locator("#detail-title")).to_have_text(LONG_CHILD)
    expect(page.locator("#filter-kind")).to_have_value("group")
    expect(page.locator("#sessions-count")).to_contain_text("page 2/")
    # A click is a new history entry; back returns to the child, forward to the click.
    row = page.locator("#sessions tbody tr").first
    clicked = row.get_attribute("data-key")
    row.click()
    expect(page.locator("#detail-title")).to_have_text(str(clicked))
    assert "session=" in page.url and "page=2" in page.url
    page.go_back()
    expect(page.locator("#detail-title")).to_have_text(LONG_CHILD)
    page.go_forward()
    expect(page.locator("#detail-title")).to_have_text(str(clicked))
    # Next page is an entry too; an edited hash (a pasted link) is followed.
    page.click("#page-next")
    expect(page.locator("#sessions-count")).to_contain_text("page 3/")
    page.go_back()
    expect(page.locator("#sessions-count")).to_contain_text("page 2/")
    page.evaluate(f"location.hash = {json.dumps('#session=' + MAIN)}")
    expect(page.locator("#detail-title")).to_have_text(MAIN)
    expect(page.locator("#filter-kind")).to_have_value("")
    expect(page.locator("#sessions-count")).to_contain_text("page 1/")


def test_relative_times_tick(signed_in: Page, loaded: dict[str, float]) -> None:
    """The same "Ns ago" element shows a newer age a few seconds later, without a reload."""
    page = signed_in
    _open_view(page, "")
    stamp = page.locator("#sessions tbody tr time.ago").first.element_handle()
    before = stamp.text_content()
    assert before and before.endswith("s ago"), before
    page.wait_for_function("([el, old]) => el.textContent !== old", arg=[stamp, before])
    assert page.evaluate("el => el.isConnected", stamp)


def test_favicon_is_served_without_a_token(signed_in: Page, api_url: str) -> None:
    """/favicon.ico and the page's icon link answer 200 with an SVG, no token needed."""
    icon = signed_in.locator("link[rel=icon]").get_attribute("href")
    assert icon == "/console/favicon.svg"
    for path in ("/favicon.ico", icon):
        resp = httpx.get(api_url + path)
        assert resp.status_code == 200, (path, resp.status_code)
        assert resp.headers["content-type"].startswith("image/svg+xml")
        assert resp.content.startswith(b"<svg")
