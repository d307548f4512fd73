"""The one loader of the store's Lua scripts: `.lua` files under `lua/`, BullMQ-style.

A script file starts with a header naming what it takes, one word per key or argument::

    -- Record a new run and take the session lane, or queue behind the holder.
    -- KEYS: run lane lane_queue leases
    -- ARGV: run_id session_key lease_at_ms fields
    -- @include set_fields

A name starting with ``*`` (``-- KEYS: session *indexes``) takes the rest of its list (a
sequence), and only the last name may. ``-- @include NAME`` pastes ``lua/includes/NAME.lua``
in place, once per script however often it is named (includes may include). Every key a
script touches arrives in KEYS, so a script can be routed on a Redis Cluster.

Call sites never count positions: ``scripts["submit_run"](run=..., lane=..., run_id=...)``
(``client=pipe`` queues it on a pipeline) matches keyword arguments to the header's names,
and refuses a missing or unknown one. Each script is registered once per client (EVALSHA,
loaded again after a SCRIPT FLUSH).

Where a script learns a key's name only as it runs (the members of an index), the caller
passes the keys it expects and the script answers a retry verdict when they were not the
right ones (recent_entries.lua says how); no script builds a key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from switchboard.shared.store.redis_errors import unavailable

_INCLUDE = re.compile(r"^--\s*@include\s+([\w/]+)\s*$")
_HEADER = re.compile(r"^--\s*(KEYS|ARGV):(.*)$")

# Where the files live, beside this module.
_LUA_DIR = "lua"


@dataclass(frozen=True)
class _Order:
    """How keyword values line up as one of a script's lists (KEYS or ARGV): its names in
    header order, the last one possibly taking the rest (``*name``). Worked out once per
    script: a call only looks its values up."""

    script: str
    names: tuple[str, ...]  # bare, in header order, the rest-taker (if any) excluded
    rest: str | None  # the bare name of a ``*name``, else None

    @classmethod
    def of(cls, script: str, header: tuple[str, ...]) -> _Order:
        rest = header[-1] if header and header[-1].startswith("*") else None
        names = header[:-1] if rest is not None else header
        return cls(script, names, _bare(rest) if rest is not None else None)

    @property
    def count(self) -> int:
        return len(self.names) + (self.rest is not None)

    def values(self, values: Mapping[str, Any]) -> list[Any]:
        try:
            out = [values[name] for name in self.names]
            if self.rest is not None:
                out.extend(values[self.rest])
        except KeyError as exc:
            raise TypeError(f"{self.script}.lua needs {exc.args[0]}") from None
        return out


@dataclass(frozen=True)
class LuaSource:
    """A script as read from its file: the expanded source and the names it takes."""

    name: str
    source: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    _keys: _Order = field(init=False, repr=False, compare=False)
    _args: _Order = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keys", _Order.of(self.name, self.keys))
        object.__setattr__(self, "_args", _Order.of(self.name, self.args))

    def split(self, values: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        """KEYS and ARGV in header order from keyword values; a missing or unknown name
        raises TypeError (a call site's bug, not a runtime condition)."""
        # Unknown names are looked for only when the count differs or a name is missing (a
        # typo): the usual call pays no set difference.
        try:
            if len(values) == self._keys.count + self._args.count:
                return self._keys.values(values), self._args.values(values)
        except TypeError:
            pass
        unknown = set(values) - {_bare(n) for n in (*self.keys, *self.args)}
        if unknown:
            raise TypeError(f"{self.name}.lua takes no {', '.join(sorted(unknown))}")
        return self._keys.values(values), self._args.values(values)


@dataclass
class LuaScript:
    """A script registered with one client: call it with keyword arguments."""

    src: LuaSource
    script: Script = field(repr=False)

    def __call__(self, *, client: Redis | None = None, **values: Any) -> Any:
        """Run it (on ``client`` when given: a pipeline queues the call). A script the
        server did not know even once redis-py loaded it again (the server changed under
        the call: a failover) is `StoreUnavailable`, as any other Redis failure."""
        keys, args = self.src.split(values)
        try:
            return self.script(keys=keys, args=args, client=client)
        except NoScriptError as exc:
            raise unavailable(exc) from exc


class LuaScripts:
    """Every script of the store, registered with one client on first use."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._registered: dict[str, LuaScript] = {}

    def __getitem__(self, name: str) -> LuaScript:
        script = self._registered.get(name)
        if script is None:
            src = load(name)
            script = LuaScript(src, self.redis.register_script(src.source))
            self._registered[name] = script
        return script


@cache
def load(name: str) -> LuaSource:
    """Read ``lua/NAME.lua``, expand its includes and parse its header (cached)."""
    text = _read(name)
    keys, args = _header(name, text)
    source = "\n".join(_expand(text, seen=set())) + "\n"
    return LuaSource(name=name, source=source, keys=keys, args=args)


@cache
def all_sources() -> tuple[str, ...]:
    """Every store script's source, as registered (the same SHA): what a client loads
    on a server that lacks them."""
    return tuple(load(name).source for name in script_names())


@cache
def all_shas() -> frozenset[str]:
    """The SHA1 of every store script (as `Script` takes it)."""
    return frozenset(hashlib.sha1(source.encode()).hexdigest() for source in all_sources())


def load_on(conn: Any) -> None:
    """Load every store script on the server of the redis-py connection ``conn``, just
    connected (pipelined: one round trip)."""
    sources = all_sources()
    for source in sources:
        conn.send_command("SCRIPT", "LOAD", source)
    for _ in sources:
        conn.read_response()


def script_names() -> list[str]:
    """The scripts there are (files directly under ``lua/``), sorted."""
    root = resources.files(__package__).joinpath(_LUA_DIR)
    return sorted(p.name[:-4] for p in root.iterdir() if p.name.endswith(".lua"))


def _read(name: str) -> str:
    path = resources.files(__package__).joinpath(_LUA_DIR, f"{name}.lua")
    return path.read_text(encoding="utf-8")


def _expand(text: str, seen: set[str]) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        m = _INCLUDE.match(line.strip())
        if m is None:
            out.append(line)
            continue
        inc = f"includes/{m.group(1)}"
        if inc not in seen:
            seen.add(inc)
            out.extend(_expand(_read(inc), seen))
    return out


def _header(name: str, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {"KEYS": (), "ARGV": ()}
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = _HEADER.match(line)
        if m is not None:
            found[m.group(1)] = tuple(m.group(2).split())
    for names in found.values():
        if any(n.startswith("*") for n in names[:-1]):
            raise ValueError(f"{name}.lua: only the last name may take the rest (*)")
    return found["KEYS"], found["ARGV"]


def _bare(name: str) -> str:
    return name.removeprefix("*")
