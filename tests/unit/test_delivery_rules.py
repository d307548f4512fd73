"""Delivery decisions without Redis: announce targets, webhook answers, backoff, ids."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from switchboard.shared.config import parse_config
from switchboard.shared.delivery.adapters import classify_status
from switchboard.shared.delivery.dispatch import backoff_s
from switchboard.shared.delivery.records import Target, delivery_id_for
from switchboard.shared.delivery.targets import target_from_entry, target_from_key
from switchboard.shared.store.keyspace import Keyspace

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("key", "target"),
    [
        ("agent:main:discord:group:dev", Target("discord", "group:dev")),
        (
            "agent:main:slack:channel:c1:thread:17.5",
            Target("slack", "channel:c1", thread_id="17.5"),
        ),
        ("agent:main:telegram:group:-100:topic:9", Target("telegram", "group:-100", thread_id="9")),
        ("agent:main:whatsapp:group:123@g.us", Target("whatsapp", "group:123@g.us")),
        ("agent:main:main", None),
        ("agent:main:hook:x", None),
        ("agent:main:discord:direct:u1", None),
    ],
)
def test_group_and_channel_keys_name_their_chat(key: str, target: Target | None) -> None:
    """`<channel>:<group|channel>:<id>[:thread|topic:<t>]` becomes the announce target."""
    assert target_from_key(key) == target


def test_entry_route_prefers_delivery_context_then_last_route_then_origin() -> None:
    """deliveryContext wins field by field; lastTo/lastChannel and origin fill the gaps."""
    fields: dict[str, Any] = {
        "deliveryContext": {"channel": "Telegram", "to": "chat-1"},
        "lastChannel": "discord",
        "lastTo": "other",
        "lastAccountId": "acct-2",
        "origin": {"provider": "x", "threadId": "th-3"},
    }
    assert target_from_entry(fields) == Target("telegram", "chat-1", "acct-2", "th-3")
    assert target_from_entry({"lastChannel": "discord", "lastTo": "u9"}) == Target("discord", "u9")


def test_entry_without_a_route_has_no_target() -> None:
    """A platform channel without `to` is no target; webchat needs none."""
    assert target_from_entry({}) is None
    assert target_from_entry({"lastChannel": "discord"}) is None
    assert target_from_entry({"deliveryContext": {"channel": "webchat"}}) == Target("webchat")


@pytest.mark.parametrize(
    ("status", "ok", "permanent"),
    [
        (200, True, False),
        (204, True, False),
        (400, False, True),
        (404, False, True),
        (408, False, False),
        (429, False, False),
        (500, False, False),
        (503, False, False),
        (302, False, False),
    ],
)
def test_webhook_status_classes(status: int, ok: bool, permanent: bool) -> None:
    """2xx delivered; 4xx other than 408/429 permanent; everything else retried."""
    result = classify_status(status, "nope")
    assert (result.ok, result.permanent) == (ok, permanent)
    if not ok:
        assert result.error == f"webhook answered HTTP {status}: nope"


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    """base · 2^(attempt-1), never above backoffMaxS."""
    config = parse_config({"delivery": {"backoffBaseS": 1.5, "backoffMaxS": 10}})
    svc: Any = SimpleNamespace(config=config)
    assert [backoff_s(svc, n) for n in (1, 2, 3, 4, 5)] == [1.5, 3.0, 6.0, 10.0, 10.0]


def test_delivery_ids_derive_from_the_idempotency_key() -> None:
    """The same key gives the same id; different keys differ."""
    key = "agent:main:main"
    assert delivery_id_for("a2a:f:announce", key) == delivery_id_for("a2a:f:announce", key)
    assert delivery_id_for("a", key) != delivery_id_for("b", key)


def test_delivery_ids_are_in_their_sessions_slot_group() -> None:
    """A delivery's id falls in its session's slot group however many groups there are."""
    for key in ("agent:main:main", "agent:ops:telegram:group:42"):
        delivery_id = delivery_id_for("a2a:f:announce", key)
        for groups in (1, 2, 7, 64, 1024):
            ks = Keyspace("sb:", groups)
            assert ks.group_of_id(delivery_id) == ks.group_of_key(key)
