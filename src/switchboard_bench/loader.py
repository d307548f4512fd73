"""Bench setup at scale: many sessions, a long transcript, written fast by the testkit's bulk
loader (`switchboard_testkit.bulk.BulkLoader`).

Nothing here invents a layout: a real agent run through the api writes a template session
and its transcript, and the loader has the store copy exactly those structures, varying
what differs between sessions (key, sessionId, times, chat type) under the store's own
kind function.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from switchboard.shared import keys as sk
from switchboard.shared.errors import Unavailable
from switchboard.shared.store import Store
from switchboard_bench.harness import Stack
from switchboard_testkit.bulk import CHUNK, BulkLoader, SessionRow

__all__ = ["CHUNK", "Template", "bench_key", "load_sessions", "load_transcript", "real_template"]

AGENT = "main"
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
    bulk = BulkLoader(store.redis, store.ks)
    return Template(session=bulk.session_fields(key), messages=bulk.transcript_payloads(key))


def load_sessions(
    store: Store,
    template: dict[str, str],
    count: int,
    *,
    now_ms: int,
    span_ms: int,
    progress: Progress,
) -> None:
    """Write ``count`` sessions shaped like ``template``, updatedAt spread over ``span_ms``.

    Each gets its own key, sessionId, createdAt, updatedAt and chatType; the other fields
    are the template's."""
    rows = _rows(store, count, now_ms, span_ms)
    BulkLoader(store.redis, store.ks).write_sessions(template, rows, advance=progress)


def _rows(store: Store, count: int, now_ms: int, span_ms: int) -> Iterator[SessionRow]:
    """The sessions to load, drawn from a fixed seed (the same dataset every run)."""
    rng = random.Random(20240601)
    shapes = [_Shape.of(store, i) for i in range(len(_SHAPES))]
    for i in range(count):
        shape = shapes[i % len(shapes)]
        updated = now_ms - rng.randrange(span_ms)
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        yield SessionRow(
            shape.key(i), AGENT, shape.kind, sid, updated - 60_000, updated, shape.chat_type
        )


@dataclass(frozen=True)
class _Shape:
    """One key shape: its kind and chat type (they depend on the shape, not the number)."""

    pattern: str
    kind: str
    chat_type: str

    @classmethod
    def of(cls, store: Store, index: int) -> _Shape:
        key = bench_key(index)
        return cls(_SHAPES[index], store.sessions.kind_of(key), sk.chat_type(key))

    def key(self, i: int) -> str:
        return sk.format_key(AGENT, self.pattern.format(i=i))


def load_transcript(
    store: Store, key: str, messages: Sequence[bytes], count: int, *, progress: Progress
) -> None:
    """Make ``key``'s transcript ``count`` messages long by repeating ``messages``."""
    BulkLoader(store.redis, store.ks).extend_transcript(key, messages, count, advance=progress)
