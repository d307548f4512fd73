"""The store's .lua files as text: no key built inside Lua, headers that match the body."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from switchboard.shared.store.lua_scripts import load, script_names

pytestmark = pytest.mark.unit

# Commands whose first argument is not a key (a channel, or none).
_NOT_KEYED = frozenset({"PUBLISH", "TIME", "ECHO", "PING"})
_CALL = re.compile(r"redis\.p?call\(")
_ASSIGN = re.compile(r"(?:local\s+)?([\w, ]+?)\s*=\s*([^=\n][^\n]*)")


def _lua_files() -> dict[str, str]:
    """Every .lua file under store/lua (scripts and includes), by relative name."""
    root = resources.files("switchboard.shared.store").joinpath("lua")
    out = {p.name: p.read_text(encoding="utf-8") for p in root.iterdir() if p.name.endswith(".lua")}
    inc = root.joinpath("includes")
    out |= {f"includes/{p.name}": p.read_text() for p in inc.iterdir() if p.name.endswith(".lua")}
    return out


def _code(text: str) -> str:
    """The text without comments (a `--` outside a string starts one)."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())


def _call_args(code: str, start: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose '(' ends at ``start``."""
    args, depth, quote, cur = [], 0, "", ""
    for ch in code[start:]:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return [*args, cur.strip()]


def _key_positions(code: str) -> list[tuple[str, str]]:
    """(command, key expression) of each redis.call whose first argument is a key."""
    out = []
    for m in _CALL.finditer(code):
        args = _call_args(code, m.end())
        command = args[0].strip("'\"").upper()
        if command not in _NOT_KEYED and len(args) > 1:
            out.append((command, args[1]))
    return out


def _built_names(code: str) -> set[str]:
    """Names assigned from an expression that concatenates (``..``) or formats text."""
    built = set()
    for m in _ASSIGN.finditer(code):
        if ".." in m.group(2) or "string.format" in m.group(2):
            built |= {n.strip() for n in m.group(1).split(",")}
    return built


@pytest.mark.parametrize("name", sorted(_lua_files()))
def test_no_lua_file_builds_a_key(name: str) -> None:
    """A redis.call's key argument is never concatenated, formatted, quoted or taken from
    ARGV, nor a name assigned from a concatenation.

    It catches the usual way a key is built (``prefix .. id`` in the call or one
    assignment before it, a literal key, a key in ARGV). It cannot follow a value through
    tables or function returns, and checks only the first key of a multi-key command
    (DEL a b): a built key that takes such a detour passes; the integration tests'
    Cluster-style key lists are the backstop."""
    code = _code(_lua_files()[name])
    built = _built_names(code)
    for command, key in _key_positions(code):
        where = f"{name}: redis.call('{command}', {key}, ...)"
        assert ".." not in key and "string.format" not in key, f"{where} concatenates a key"
        assert "ARGV" not in key, f"{where} takes a key from ARGV"
        assert not key.startswith(("'", '"')), f"{where} names a literal key"
        assert key not in built, f"{where} uses a key built by concatenation"


def test_the_lint_catches_the_key_building_it_claims_to() -> None:
    """The checks above fail on the shapes they describe (the lint can fail)."""
    bad = "local h = ARGV[4] .. id\nredis.call('HGETALL', h)\nredis.call('GET', 'sb:x')"
    code = _code(bad)
    keys = [key for _, key in _key_positions(code)]
    assert keys == ["h", "'sb:x'"] and _built_names(code) == {"h"}
    inline = _key_positions(_code("redis.call('HGET', ARGV[1] .. rows[j], 'f')"))
    assert inline == [("HGET", "ARGV[1] .. rows[j]")]


@pytest.mark.parametrize("name", script_names())
def test_a_script_reads_only_the_positions_its_header_names(name: str) -> None:
    """No KEYS[n] or ARGV[n] beyond the header's names (unless its last name takes the
    rest): a header cannot drift from its body unnoticed."""
    src = load(name)
    for table, names in (("KEYS", src.keys), ("ARGV", src.args)):
        if names and names[-1].startswith("*"):
            continue
        used = [int(n) for n in re.findall(rf"\b{table}\[(\d+)\]", _code(src.source))]
        assert max(used, default=0) <= len(names), f"{name}.lua reads {table}[{max(used)}]"
