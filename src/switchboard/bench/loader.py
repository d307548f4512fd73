"""Bench setup at scale: many sessions, a long transcript, written fast with pipelines.

Nothing here invents a layout: a real agent run through the api writes a template session
and its transcript, and the loader copies exactly those structures (the session hash, the
sessionId index, the updatedAt indexes for all / agent / kind, the transcript stream with
``<seq>-0`` ids) under the store's own `Keyspace` and kind function.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from redis import Connection
from redis.exceptions import ResponseError

from switchboard.bench.harness import Stack
from switchboard.shared import keys as sk
from switchboard.shared.errors import Unavailable
from switchboard.shared.store import Store

AGENT = "main"
CHUNK = 5000
# Key shapes cycled through, one per kind the listing can filter on.
_SHAPES = (
    "discord:group:g{i}",  # group
    "cron:job-{i}",  # cron
    "hook:h{i}",  # hook
    "telegram:direct:u{i}",  # other
    "node-{i}",  # node
)

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Template:
    """What one real run left in Redis: the session hash and the transcript entries."""

    session: dict[str, str]
    messages: list[bytes]


def bench_key(i: int) -> str:
    """The i-th loaded session key (kinds cycle: group, cron, hook, other, node)."""
    return sk.format_key(AGENT, _SHAPES[i % len(_SHAPES)].format(i=i))


def real_template(st: Stack, store: Store, key: str, runs: int = 3) -> Template:
    """Run ``runs`` real agent runs in ``key`` through the api and read what they wrote."""
    with st.http() as http:
        for i in range(runs):
            message = f"message {i}: the quick brown fox jumps over the lazy dog"
            started = st.rpc(http, "agent", sessionKey=key, message=message)
            outcome = st.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)
            if outcome.get("status") != "ok":
                raise Unavailable(f"template run did not succeed: {outcome}")
    raw = cast(dict[bytes, bytes], store.redis.hgetall(store.ks.session(key)))
    entries = cast(
        list[tuple[bytes, dict[bytes, bytes]]], store.redis.xrange(store.ks.transcript(key))
    )
    session = {k.decode(): v.decode() for k, v in raw.items()}
    return Template(session=session, messages=[fields[b"m"] for _, fields in entries])


def load_sessions(
    store: Store,
    template: Mapping[str, str],
    count: int,
    *,
    now_ms: int,
    span_ms: int,
    progress: Progress,
) -> None:
    """Write ``count`` sessions shaped like ``template``, updatedAt spread over ``span_ms``.

    Each gets its own key, sessionId, createdAt, updatedAt and chatType; the other fields
    are the template's. Commands go out as raw RESP in large batches (building them with
    the client library costs more than Redis spends executing them)."""
    rng = random.Random(20240601)
    ks = store.ks
    shapes = [_Shape.of(store, i) for i in range(len(_SHAPES))]
    varying = ("sessionId", "createdAt", "updatedAt", "chatType")
    fields = {k: v for k, v in template.items() if k not in varying}
    const = b"".join(_bulk(k.encode()) + _bulk(v.encode()) for k, v in fields.items())
    head = b"*%d\r\n$4\r\nHSET\r\n" % (2 + 2 * (len(fields) + len(varying)))
    # One format per session: key, sessionId, createdAt, updatedAt (+ chatType, the rest).
    entry = (
        head
        + b"$%d\r\n%s\r\n"
        + b"".join(_bulk(name.encode()) + b"$%d\r\n%s\r\n" for name in varying[:3])
    )
    with _RawPipe(store) as pipe:
        for start in range(0, count, CHUNK):
            stop = min(count, start + CHUNK)
            by_sid: list[bytes] = []
            scores: list[bytes] = []
            by_kind: dict[str, list[bytes]] = defaultdict(list)
            for i in range(start, stop):
                shape = shapes[i % len(shapes)]
                key = shape.key(i).encode()
                session = ks.session("").encode() + key
                updated = now_ms - rng.randrange(span_ms)
                sid = str(uuid.UUID(int=rng.getrandbits(128), version=4)).encode()
                times = b"%d" % (updated - 60_000), b"%d" % updated
                pipe.add(
                    entry
                    % (
                        len(session),
                        session,
                        len(sid),
                        sid,
                        len(times[0]),
                        times[0],
                        len(times[1]),
                        times[1],
                    )
                    + b"$8\r\nchatType\r\n"
                    + shape.chat_type
                    + const
                )
                member = _bulk(times[1]) + _bulk(key)
                by_sid.append(_bulk(sid) + _bulk(key))
                scores.append(member)
                by_kind[shape.kind].append(member)
            pipe.add(_pairs(b"HSET", ks.session_ids, by_sid))
            pipe.add(_pairs(b"ZADD", ks.updated_all, scores))
            pipe.add(_pairs(b"ZADD", ks.updated_agent(AGENT), scores))
            for kind, members in by_kind.items():
                pipe.add(_pairs(b"ZADD", ks.updated_kind(AGENT, kind), members))
            pipe.flush()
            progress(stop - start)


@dataclass(frozen=True)
class _Shape:
    """One key shape: its kind and chat type (they depend on the shape, not the number)."""

    pattern: str
    kind: str
    chat_type: bytes

    @classmethod
    def of(cls, store: Store, index: int) -> _Shape:
        key = bench_key(index)
        chat = sk.chat_type(key).encode()
        return cls(_SHAPES[index], store.sessions.kind_of(key), _bulk(chat))

    def key(self, i: int) -> str:
        return sk.format_key(AGENT, self.pattern.format(i=i))


class _RawPipe:
    """A pipeline on its own connection: RESP bytes in, every reply read (errors raise).

    A batch is sent before the replies of the one before it are read, so Redis executes
    while the loader builds the next batch."""

    def __init__(self, store: Store) -> None:
        kwargs = store.redis.connection_pool.connection_kwargs
        host, port = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)
        self.conn = Connection(host=host, port=port)  # type: ignore[no-untyped-call]
        self.buf: list[bytes] = []
        self.unread = 0

    def add(self, command: bytes) -> None:
        self.buf.append(command)

    def flush(self) -> None:
        """Send what was added; read the replies of the previous batch."""
        previous, self.unread = self.unread, len(self.buf)
        if self.buf:
            self.conn.send_packed_command([b"".join(self.buf)])  # type: ignore[no-untyped-call]
            self.buf.clear()
        self._read(previous)

    def _read(self, count: int) -> None:
        for _ in range(count):
            reply = self.conn.read_response()
            if isinstance(reply, ResponseError):
                raise reply

    def __enter__(self) -> _RawPipe:
        self.conn.connect()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if exc_info[0] is None:
                self.flush()
                self._read(self.unread)
        finally:
            self.conn.disconnect()  # type: ignore[no-untyped-call]


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _pairs(command: bytes, key: str, pairs: list[bytes]) -> bytes:
    """``command key`` followed by pre-encoded argument pairs (field value / score member)."""
    head = b"*%d\r\n" % (2 + 2 * len(pairs)) + _bulk(command) + _bulk(key.encode())
    return head + b"".join(pairs)


def load_transcript(
    store: Store, key: str, messages: Sequence[bytes], count: int, *, progress: Progress
) -> None:
    """Make ``key``'s transcript ``count`` messages long by repeating ``messages``."""
    have = int(store.redis.xlen(store.ks.transcript(key)))
    for start in range(have + 1, count + 1, CHUNK):
        stop = min(count, start + CHUNK - 1)
        pipe = store.redis.pipeline(transaction=False)
        for seq in range(start, stop + 1):
            payload = messages[(seq - 1) % len(messages)]
            pipe.xadd(store.ks.transcript(key), {"m": payload}, id=f"{seq}-0")
        pipe.execute()
        progress(stop - start + 1)
    store.redis.hset(store.ks.session(key), "seq", count)
