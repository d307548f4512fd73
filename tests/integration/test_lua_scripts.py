"""The store's Lua loader: headers name KEYS and ARGV, includes expand once, every file loads."""

from __future__ import annotations

import pytest
import redis

from switchboard.shared.store import lua_scripts
from switchboard.shared.store.lua_scripts import LuaScripts, load, script_names

pytestmark = pytest.mark.integration


def test_header_names_keys_and_args_in_order() -> None:
    """advance_link.lua declares one key and four named arguments."""
    src = load("advance_link")
    assert src.keys == ("link",)
    assert src.args == ("status", "turn", "fields", "ttl_s")


def test_includes_expand_once_and_before_use() -> None:
    """touch, transcript_append and claim_run each include hash_buffer; a script naming
    them all gets each function once, the included one first."""
    source = load("start_run").source
    assert source.count("local function hash_open") == 1
    assert source.count("local function touch_in") == 1
    assert source.index("function hash_open") < source.index("function touch_in")
    assert "@include" not in source


def test_keyword_values_map_to_positions_and_refuse_unknown_or_missing() -> None:
    """Call sites pass names; a typo or a missing name is refused before Redis sees it."""
    src = load("advance_link")
    keys, args = src.split({"link": "k", "status": "s", "turn": "", "fields": "{}", "ttl_s": 9})
    assert keys == ["k"] and args == ["s", "", "{}", 9]
    with pytest.raises(TypeError, match="needs ttl_s"):
        src.split({"link": "k", "status": "s", "turn": "", "fields": "{}"})
    with pytest.raises(TypeError, match="takes no tll_s"):
        src.split({"link": "k", "status": "s", "turn": "", "fields": "{}", "tll_s": 9})


def test_rest_name_takes_a_sequence() -> None:
    """A `*name` at the end of a header list spreads the sequence it is given."""
    src = lua_scripts.LuaSource("t", "", keys=("a", "*rest"), args=())
    assert src.split({"a": "x", "rest": ["y", "z"]}) == (["x", "y", "z"], [])


def test_every_script_compiles_on_a_real_redis_and_names_its_keys(
    redis_client: redis.Redis,
) -> None:
    """Each .lua file's header parses and its expanded source SCRIPT LOADs (it compiles)."""
    names = script_names()
    assert {"advance_link", "start_run", "finish_run", "claim_run", "recent_entries"} <= set(names)
    for name in names:
        src = load(name)
        assert src.keys, f"{name}.lua names no KEYS"
        assert "@include" not in src.source, f"{name}.lua left an include unexpanded"
        sha = redis_client.script_load(src.source)
        assert redis_client.script_exists(sha) == [True], name


def test_a_script_refuses_a_missing_or_unknown_keyword(redis_client: redis.Redis) -> None:
    """A registered script checks its keywords before Redis sees the call."""
    release = LuaScripts(redis_client)["release_lane"]
    keys = {"lane": "l", "lane_queue": "q", "leases": "z"}
    with pytest.raises(TypeError, match="needs lease_at_ms"):
        release(**keys, holder="r1", session_key="s")
    with pytest.raises(TypeError, match="takes no lease_ms"):
        release(**keys, holder="r1", session_key="s", lease_at_ms=1, lease_ms=1)
    assert release(**keys, holder="r1", session_key="s", lease_at_ms=1) == b""


def test_scripts_run_on_a_real_redis(redis_client: redis.Redis) -> None:
    """advance_link applies when the hash is at the expected status and refuses after."""
    redis_client.hset("flow", mapping={"status": "running", "turn": "1"})
    scripts = LuaScripts(redis_client)
    step = scripts["advance_link"]
    made = step(link="flow", status="running", turn="1", fields='{"status":"done"}', ttl_s=60)
    assert made == 1
    assert redis_client.hget("flow", "status") == b"done"
    assert 0 < redis_client.ttl("flow") <= 60
    again = step(link="flow", status="running", turn="1", fields='{"status":"x"}', ttl_s=60)
    assert again == 0
    assert redis_client.hget("flow", "status") == b"done"
