"""Session entries and their indexes: by sessionId, by label, by updatedAt (all, agent, kind).

Listing never scans the store: it reads bounded ranges of the sorted-set indexes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared import keys as sk
from switchboard.shared.errors import Conflict
from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.shared.store.runs import now_ms

# Fields kept as integers / booleans / JSON when read back; everything else is text.
_INT_FIELDS = frozenset(
    {
        "createdAt",
        "updatedAt",
        "seq",
        "contextTokens",
        "inputTokens",
        "outputTokens",
        "totalTokens",
        "spawnDepth",
        "startedAt",
        "endedAt",
        "runtimeMs",
    }
)
_BOOL_FIELDS = frozenset({"systemSent", "abortedLastRun", "deliver"})
_JSON_FIELDS = frozenset({"deliveryContext", "origin"})

# How many index sets `SessionStore.recent_entries` remembers a first page for.
_PAGE_HINTS_KEPT = 64
# The least a listing reads of each index before it knows whether it needs more.
_SHARE_FLOOR = 4


@dataclass(frozen=True)
class IndexCursor:
    """Where a page of the updatedAt indexes ended: the last score it returned and the
    keys it returned with that score (the next page starts there, skipping them)."""

    score: int
    keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SessionEntry:
    """One session entry with typed fields (camelCase, as OpenClaw names them)."""

    key: str
    fields: Mapping[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        """A field or the default."""
        return self.fields.get(name, default)

    @property
    def session_id(self) -> str:
        """The session's UUID."""
        return str(self.fields.get("sessionId", ""))

    @property
    def updated_at_ms(self) -> int:
        """Last activity (ms)."""
        return int(self.fields.get("updatedAt") or 0)

    @classmethod
    def from_hash(cls, key: str, raw: Mapping[str, str]) -> SessionEntry:
        """Decode a HGETALL reply (the typed fields converted, the rest kept as text)."""
        out: dict[str, Any] = dict(raw)
        names = out.keys()
        for name in _INT_FIELDS & names:
            out[name] = codec.as_int(out[name])
        for name in _BOOL_FIELDS & names:
            out[name] = codec.as_bool(out[name])
        for name in _JSON_FIELDS & names:
            out[name] = codec.as_json(out[name])
        return cls(key=key, fields=out)


def _next_cursor(
    page: list[tuple[str, int]], limit: int, after: IndexCursor | None
) -> IndexCursor | None:
    """Where the page after ``page`` starts (None when the indexes had fewer rows)."""
    if len(page) < limit:
        return None
    last = page[-1][1]
    ties = {key for key, score in page if score == last}
    if after is not None and last == after.score:
        ties |= after.keys
    return IndexCursor(score=last, keys=frozenset(ties))


class SessionStore:
    """Session entries in Redis hashes, plus the lookup and ordering indexes."""

    def __init__(self, redis: Redis, ks: Keyspace, kind_of: Callable[[str], str]) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)
        self.kind_of = kind_of
        # The members of the last first page listed per index set: recent_entries.lua is
        # handed their hashes (it builds no key), so a listing whose first page has not
        # changed takes one round trip.
        self._page_hints: dict[tuple[str, ...], list[str]] = {}

    def _index_keys(self, key: str) -> list[str]:
        agent_id = sk.agent_id_of(key)
        group = self.ks.beside(key)
        return [
            group.updated_all,
            group.updated_agent(agent_id),
            group.updated_kind(agent_id, self.kind_of(key)),
        ]

    def ensure(
        self,
        key: str,
        *,
        on_create: Mapping[str, Any] | None = None,
        always: Mapping[str, Any] | None = None,
    ) -> tuple[str, bool]:
        """Create the entry if missing and touch it; returns (sessionId, created).

        A ``label`` among the fields goes through the label index (labels are unique)."""
        on_create = dict(on_create or {})
        label = on_create.pop("label", None)
        res = self._ensure(key, on_create, always or {})
        created = bool(int(res[0]))
        if created and label:
            self.patch(key, {"label": label})
        return as_text(res[1]), created

    def touch(self, key: str, *, client: Pipeline) -> None:
        """Queue on ``client``: create the entry if missing (no label) and touch it, as
        `ensure` does, for a caller that needs no answer."""
        self._ensure(key, {}, {}, client=client)

    def _ensure(
        self,
        key: str,
        on_create: Mapping[str, Any],
        always: Mapping[str, Any],
        client: Pipeline | None = None,
    ) -> Any:
        idx_all, idx_agent, idx_kind = self._index_keys(key)
        group = self.ks.beside(key)
        return self._lua["ensure_session"](
            client=client,
            session=self.ks.session(key),
            sid_index=group.session_ids,
            idx_all=idx_all,
            idx_agent=idx_agent,
            idx_kind=idx_kind,
            session_key=key,
            now=now_ms(),
            session_id=self.ks.new_id(group.group),
            on_create=codec.fields_json(on_create),
            always=codec.fields_json(always),
        )

    def get(self, key: str) -> SessionEntry | None:
        """The entry, or None."""
        raw = self.redis.hgetall(self.ks.session(key))
        return SessionEntry.from_hash(key, codec.decode_hash(raw)) if raw else None

    def get_many(self, keys: Sequence[str]) -> list[SessionEntry | None]:
        """Several entries in one round trip (a step per slot group, pipelined)."""
        if not keys:
            return []
        by_group: dict[int, list[int]] = {}
        for at, key in enumerate(keys):
            by_group.setdefault(self.ks.group_of_key(key), []).append(at)
        pipe = self.redis.pipeline(transaction=False)
        for positions in by_group.values():
            hashes = [self.ks.session(keys[at]) for at in positions]
            self._lua["get_hashes"](client=pipe, hashes=hashes)
        flats: list[Any] = [None] * len(keys)
        for positions, replies in zip(by_group.values(), pipe.execute(), strict=True):
            for at, flat in zip(positions, replies, strict=True):
                flats[at] = flat
        return [
            SessionEntry.from_hash(key, codec.decode_flat_hash(flat)) if flat else None
            for key, flat in zip(keys, flats, strict=True)
        ]

    def exists(self, key: str) -> bool:
        """True when the session has an entry."""
        return bool(self.redis.exists(self.ks.session(key)))

    def key_for_session_id(self, session_id: str) -> str | None:
        """The canonical key of a sessionId."""
        sid = session_id.lower()
        return as_text(self.redis.hget(self.ks.session_ids_of(sid), sid)) or None

    def key_for_label(self, label: str) -> str | None:
        """The canonical key that carries a label."""
        return as_text(self.redis.hget(self.ks.labels, label)) or None

    def patch(self, key: str, fields: Mapping[str, Any]) -> None:
        """Set (or, with None, clear) fields of an existing entry; labels stay unique."""
        if "label" in fields:
            self._move_label(key, fields["label"])
        set_map = {k: codec.encode_value(v) for k, v in fields.items() if v is not None}
        del_names = [k for k, v in fields.items() if v is None]
        pipe = self.redis.pipeline(transaction=True)
        if set_map:
            pipe.hset(self.ks.session(key), mapping=set_map)  # type: ignore[arg-type]
        if del_names:
            pipe.hdel(self.ks.session(key), *del_names)
        pipe.execute()

    def _move_label(self, key: str, label: str | None) -> None:
        old = as_text(self.redis.hget(self.ks.session(key), "label")) or None
        if label == old:
            return
        if label is not None and not self.redis.hsetnx(self.ks.labels, label, key):
            holder = self.key_for_label(label)
            if holder != key:
                raise Conflict(f"label already in use: {label}", field="label")
        if old is not None and self.key_for_label(old) == key:
            self.redis.hdel(self.ks.labels, old)

    def delete(self, key: str) -> bool:
        """Remove an entry, its transcript, its steer inbox and notices and its index
        entries; False when it did not exist."""
        entry = self.get(key)
        if entry is None:
            return False
        # The session's own keys in one transaction (its slot group's); the sessionId and
        # label index entries after it, each where it lives (a sessionId made for the
        # session is in its group, the label index in the home group).
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(
            self.ks.session(key),
            self.ks.transcript(key),
            self.ks.children(key),
            self.ks.steer_inbox(key),
            self.ks.notices(key),
        )
        for idx in self._index_keys(key):
            pipe.zrem(idx, key)
        parent = entry.get("spawnedBy")
        if parent and self.ks.group_of_key(parent) == self.ks.group_of_key(key):
            pipe.zrem(self.ks.children(parent), key)
        pipe.execute()
        after = self.redis.pipeline(transaction=False)
        after.hdel(self.ks.session_ids_of(entry.session_id), entry.session_id)
        label = entry.get("label")
        if label and self.key_for_label(label) == key:
            after.hdel(self.ks.labels, label)
        if parent and self.ks.group_of_key(parent) != self.ks.group_of_key(key):
            after.zrem(self.ks.children(parent), key)
        after.execute()
        return True

    def add_child(self, parent: str, child: str) -> None:
        """Record that ``parent`` spawned ``child``."""
        self.redis.zadd(self.ks.children(parent), {child: now_ms()})

    def children(self, parent: str) -> list[str]:
        """Direct children of a session, oldest first."""
        return [as_text(v) for v in self.redis.zrange(self.ks.children(parent), 0, -1)]

    def recent_keys(
        self,
        *,
        agent_ids: Iterable[str] | None,
        kinds: Iterable[str] | None,
        min_updated_ms: int | None,
        limit: int,
        offset: int = 0,
    ) -> list[tuple[str, int]]:
        """Up to ``limit`` (key, updatedAt) pairs, newest first, from the indexes only."""
        indexes = self._indexes_for(agent_ids, kinds)
        lo = "-inf" if min_updated_ms is None else str(min_updated_ms)
        want = offset + limit
        return self._top(indexes, "+inf", lo, want)[offset:want]

    def recent_page(
        self,
        *,
        agent_ids: Iterable[str] | None,
        kinds: Iterable[str] | None,
        min_updated_ms: int | None,
        limit: int,
        after: IndexCursor | None = None,
    ) -> tuple[list[tuple[str, int]], IndexCursor | None]:
        """Up to ``limit`` (key, updatedAt) pairs, newest first, from the indexes only,
        continuing ``after`` a previous page; and the cursor of the next page (None when
        the indexes have no more).

        Each page is one bounded range read per index, however deep it is."""
        indexes = self._indexes_for(agent_ids, kinds)
        lo = "-inf" if min_updated_ms is None else str(min_updated_ms)
        hi = "+inf" if after is None else str(after.score)
        skip = after.keys if after is not None else frozenset()
        want = limit + len(skip)
        out: list[tuple[str, int]] = []
        for key, score in self._top(indexes, hi, lo, want):
            if after is not None and score == after.score and key in skip:
                continue
            out.append((key, score))
            if len(out) >= limit:
                break
        return out, _next_cursor(out, limit, after)

    def _top(self, indexes: Sequence[str], hi: str, lo: str, want: int) -> list[tuple[str, int]]:
        """The ``want`` highest-scored (member, score) pairs between ``hi`` and ``lo`` of
        ``indexes`` merged, newest first, ties in index order then position.

        Each index is read for its share first (twice ``want`` over the indexes, at least
        `_SHARE_FLOOR`): with many (a store cut into slot groups: an index per group) that
        reads about twice ``want`` rows in all, not ``want`` per index. An index whose
        share ends at or above the ``want``-th score so far may hold more of the answer:
        it alone is read on from there, in a second round trip."""
        share = max(_SHARE_FLOOR, -(-2 * want // len(indexes))) if indexes else want
        share = min(share, want)
        pipe = self.redis.pipeline(transaction=False)
        for idx in indexes:
            pipe.zrevrangebyscore(idx, hi, lo, start=0, num=share, withscores=True)
        rows = [[(as_text(m), int(s)) for m, s in found] for found in pipe.execute()]
        merged = list(heapq.merge(*rows, key=lambda pair: -pair[1]))
        floor = merged[want - 1][1] if len(merged) >= want else None
        more = [
            i
            for i, found in enumerate(rows)
            if len(found) == share and share < want and (floor is None or found[-1][1] >= floor)
        ]
        if not more:
            return merged[:want]
        pipe = self.redis.pipeline(transaction=False)
        for i in more:  # the same range from the share on, down to the floor
            low = lo if floor is None else str(floor)
            pipe.zrevrangebyscore(indexes[i], hi, low, start=share, num=want, withscores=True)
        for i, found in zip(more, pipe.execute(), strict=True):
            rows[i] += [(as_text(m), int(s)) for m, s in found]
        return list(heapq.merge(*rows, key=lambda pair: -pair[1]))[:want]

    def recent_entries(
        self,
        *,
        agent_ids: Iterable[str] | None,
        kinds: Iterable[str] | None,
        min_updated_ms: int | None,
        limit: int,
    ) -> tuple[list[tuple[str, int]], list[SessionEntry | None], IndexCursor | None]:
        """The first page of ``recent_page`` and each listed session's entry, in one round
        trip: (key, updatedAt) pairs, their entries (None for a key whose entry is gone),
        and the cursor of the next page."""
        agent_ids = None if agent_ids is None else list(agent_ids)
        kinds = None if kinds is None else list(kinds)
        lo = "-inf" if min_updated_ms is None else str(min_updated_ms)
        rows = None
        if self.ks.groups == 1:  # one step reads indexes and hashes of one slot only
            rows = self._recent_rows(tuple(self._indexes_for(agent_ids, kinds)), lo, limit)
        if rows is None:  # several groups, or the page kept changing: read it in two steps
            listed, cursor = self.recent_page(
                agent_ids=agent_ids, kinds=kinds, min_updated_ms=min_updated_ms, limit=limit
            )
            return listed, self.get_many([key for key, _ in listed]), cursor
        page: list[tuple[str, int]] = []
        entries: list[SessionEntry | None] = []
        for member, score, flat in rows:
            key = as_text(member)
            page.append((key, int(float(as_text(score)))))
            entries.append(
                SessionEntry.from_hash(key, codec.decode_flat_hash(flat)) if flat else None
            )
        return page, entries, _next_cursor(page, limit, None)

    def _recent_rows(self, indexes: tuple[str, ...], lo: str, limit: int) -> Any:
        """recent_entries.lua's rows, handing it the hashes of the members it asks for
        (at most three tries); None when every try found a member it was not handed."""
        members = self._page_hints.get(indexes, [])
        for _ in range(3):
            rows = self._lua["recent_entries"](
                keys=[*indexes, *(self.ks.session(m) for m in members)],
                max_score="+inf",
                min_score=lo,
                want=limit,
                indexes=len(indexes),
                members=codec.dumps(members),
            )
            if not rows or not isinstance(rows[0], bytes | str):
                if len(self._page_hints) >= _PAGE_HINTS_KEPT:
                    self._page_hints.clear()  # a crude bound: hints are only a guess
                self._page_hints[indexes] = [as_text(row[0]) for row in rows]
                return rows
            members = [as_text(m) for m in rows[1]]  # {'retry', the page's members}
        return None

    def _indexes_for(
        self, agent_ids: Iterable[str] | None, kinds: Iterable[str] | None
    ) -> list[str]:
        """Every slot group's indexes that list the sessions of ``agent_ids`` (None: all)
        of ``kinds`` (None: all); a listing merges them by score."""
        kinds = list(kinds) if kinds is not None else None
        groups = self.ks.every_group()
        if agent_ids is None:
            if kinds is None:
                return [g.updated_all for g in groups]
            agent_ids = self.agent_ids()
        agent_ids = list(agent_ids)
        if kinds is None:
            return [g.updated_agent(a) for g in groups for a in agent_ids]
        return [g.updated_kind(a, k) for g in groups for a in agent_ids for k in kinds]

    def agent_ids(self) -> list[str]:
        """Agents that own at least one session (from the per-agent index names)."""
        marker = self.ks.home.updated_agent("").removeprefix(self.ks.home.prefix)
        found: set[str] = set()
        for name in self.redis.scan_iter(match=self.ks.updated_agent_match, count=1000):
            rest = as_text(name).partition(marker)[2]
            if rest and ":" not in rest:
                found.add(rest)
        return sorted(found)

    def count(self) -> int:
        """Number of sessions in the updatedAt indexes of every group."""
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zcard(group.updated_all)
        return sum(int(n) for n in pipe.execute())
