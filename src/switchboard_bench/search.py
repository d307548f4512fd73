"""`sessions_search` at scale: many sessions of one agent, 20 messages each, searched for a
phrase every message holds (the worst case of the bounded scan: every scanned message is a
candidate) by a session that sees exactly that agent's sessions (visibility ``agent``).

Run on request only (``switchboard bench -s search``). The anchor is the same bounded scan
done in the client: read the same sessions' newest messages and match them in Python.
"""

from __future__ import annotations

import time
from typing import Any

from switchboard.shared.services import Services
from switchboard.shared.store.transcripts import decode_entries
from switchboard.shared.tools.sessions_list import visible_sessions
from switchboard.shared.tools.sessions_search import SCAN_MESSAGES, SCAN_SESSIONS
from switchboard_bench import loader
from switchboard_bench.harness import ONE_AGENT_STACK, BenchRun, phase
from switchboard_bench.report import Outcome, latency_summary, ratio
from switchboard_bench.scale import _context, _measure_tool, _sample, _timed_load
from switchboard_testkit.bulk import BulkLoader

MESSAGES_PER_SESSION = 20
QUERY = "quick brown fox"
_TARGET_MS = 50.0
_SPAN_MS = 7 * 24 * 3600 * 1000


def search(run: BenchRun) -> Outcome:
    """`sessions_search` (limit 10) over ``count`` sessions x 20 messages of one agent."""
    count = 10_000 if run.quick else 100_000
    samples, anchors = (100, 10) if run.quick else (300, 20)
    progress = run.progress
    # A stack of its own (no anchor workers): no other scenario's sessions in its indexes.
    st = run.stacks.get("search", **{**ONE_AGENT_STACK, "anchors": False})
    svc = st.services()
    with phase(progress, "search: real runs for the message template"):
        template = loader.real_template(st, svc.store, "agent:main:bench:search")
    now = int(time.time() * 1000)

    def load(advance: Any) -> None:
        loader.load_sessions(
            svc.store, template.session, count, now_ms=now, span_ms=_SPAN_MS, progress=advance
        )
        bulk = BulkLoader(svc.store.redis, svc.store.ks)
        for i in range(count):
            key = loader.bench_key(i)
            bulk.extend_transcript(key, template.messages, MESSAGES_PER_SESSION, advance=advance)

    label = f"search: load {count:,} sessions x {MESSAGES_PER_SESSION} messages"
    load_s = _timed_load(progress, label, count * (1 + MESSAGES_PER_SESSION), load)
    args = {"query": QUERY, "limit": 10}
    result, ours, http_ms = _measure_tool(st, svc, progress, "sessions_search", args, samples)
    base = _sample(progress, "search: anchor client-side scan", anchors, lambda: _anchor(svc))
    figure: dict[str, Any] = {**latency_summary(ours), "http": latency_summary(http_ms)}
    anchor = latency_summary(base)
    return Outcome(
        scenario="search",
        title="sessions_search at scale",
        figure=figure,
        anchor={"what": "the same bounded scan read and matched in the client", **anchor},
        ratio=ratio(anchor["p50_ms"], figure["p50_ms"]),
        ratio_text="anchor p50 / p50 (speed-up)",
        target=f"p50 ≤ {_TARGET_MS:g} ms",
        passed=figure["p50_ms"] <= _TARGET_MS,
        figure_text=(
            f"p50 {figure['p50_ms']:.2f} ms, p99 {figure['p99_ms']:.2f} ms "
            f"(HTTP p50 {figure['http']['p50_ms']:.1f} ms)"
        ),
        anchor_text=f"p50 {anchor['p50_ms']:,.1f} ms",
        parameters={
            "sessions": count,
            "messagesPerSession": MESSAGES_PER_SESSION,
            "scanBound": f"{SCAN_SESSIONS} sessions x {SCAN_MESSAGES} messages",
            "loadS": round(load_s, 1),
            "args": args,
            "samples": samples,
            "measured": "tool handler in-process against the real Redis; http = /tools/invoke",
        },
        checks={
            "tenHits": len(result.get("results", [])) == 10,
            "truncated": result.get("truncated") is True,
        },
    )


def _anchor(svc: Services) -> int:
    """The bounded scan in the client: the newest messages of the same sessions, decoded
    and matched in Python; how many match."""
    entries, _ = visible_sessions(_context(svc), SCAN_SESSIONS)
    pipe = svc.store.redis.pipeline(transaction=False)
    for entry in entries:
        pipe.xrevrange(svc.store.ks.transcript(entry.key), count=SCAN_MESSAGES)
    words = QUERY.split()
    found = 0
    for rows in pipe.execute():
        for message in decode_entries(rows, newest_first=True):
            text = str(message.get("content")).lower()
            found += any(w in text for w in words)
    return found
