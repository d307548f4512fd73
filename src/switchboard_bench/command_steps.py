"""Where a send+wait's Redis commands go, step by step: MONITOR on a few untimed sends.

``INFO commandstats`` (`costs`) says how many commands a send+wait costs, not which step
runs them. Here a few more sends into fresh sessions, each once the last one's follow-ups
are done, are watched with ``MONITOR`` (`ServerStats.monitor`). A command a Lua script ran
counts with its script call, named through the store's script loader (the SHA-1 of each
``lua/*.lua`` as loaded is the EVALSHA's), and each script call with the step of the send
it is by its place in the send:

    submit    the api's start of the target run (start_run) and the reads before it
    message   the Celery message: the api's LPUSH, the worker's BRPOP (idle ones too)
    claim     the worker's claim of the target run (claim_run)
    end       the target run's end (finish_run)
    announce  the announce run: started and claimed by the reply-back step (start_run),
              ended (finish_run)
    delivery  the announce's outcome on the flow (advance_link), the outbox cleared
    other     what the stack does meanwhile on its own (heartbeats)

A plain command counts with the step of the script call before it (submit before any).
The bench's own polls between the sends (`ProgressReads.backlog_commands`) are left out.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from switchboard.shared.store.lua_scripts import load, script_names
from switchboard.shared.store.stats import Monitored, ServerStats
from switchboard.workers.app import ALL_QUEUES

if TYPE_CHECKING:
    from switchboard_bench.harness import Stack

SENDS = 5  # watched sends: MONITOR costs the server a copy of every command

STEPS = ("submit", "message", "claim", "end", "announce", "delivery", "other")
# The step of the n-th call of a script in one send (0 first); another is named as its script.
_STEP_OF = {
    ("start_run", 0): "submit",
    ("claim_run", 0): "claim",
    ("finish_run", 0): "end",
    ("start_run", 1): "announce",
    ("claim_run", 1): "announce",
    ("finish_run", 1): "announce",
    ("advance_link", 0): "delivery",
}
_BROKER = frozenset({"lpush", "brpop"})  # kombu's commands on its queue lists
_SCRIPT_CALLS = frozenset({"evalsha", "eval"})


def scripts_by_sha() -> dict[str, str]:
    """The store's scripts by the SHA-1 an EVALSHA names them with."""
    return {
        hashlib.sha1(load(name).source.encode(), usedforsecurity=False).hexdigest(): name
        for name in script_names()
    }


def step_costs(st: Stack, send: Callable[[int], None], n: int = SENDS) -> dict[str, Any]:
    """Redis commands per send+wait by step (and by script or command within each), over
    ``n`` sends made by ``send(i)`` one after another, each once the stack is idle."""
    polls = set(st.store().progress.backlog_commands(ALL_QUEUES))
    st.wait_idle()
    sends: list[Sequence[Monitored]] = []
    with ServerStats(st.redis.client()).monitor() as watching:
        for i in range(n):
            before = len(watching.commands())
            send(i)
            st.wait_idle()
            sends.append(watching.commands()[before:])
    by_step: dict[str, Counter[str]] = {step: Counter() for step in STEPS}
    shas = scripts_by_sha()
    for commands in sends:
        for step, name, count in attribute(commands, shas, polls, st.store().ks.apis):
            by_step.setdefault(step, Counter())[name] += count
    return summary(by_step, n)


def attribute(
    commands: Sequence[Monitored], shas: Mapping[str, str], polls: set[str], apis_key: str
) -> list[tuple[str, str, int]]:
    """(step, script or command name, commands) of each call of one send, in order: a
    script call with the commands it ran, a plain command alone."""
    out: list[tuple[str, str, int]] = []
    seen: Counter[str] = Counter()
    step = "submit"
    for c in commands:
        if c.client == "lua":
            if out:  # a command its script ran, counted with the script call
                last_step, last_name, count = out[-1]
                out[-1] = (last_step, last_name, count + 1)
            continue
        name = c.name
        if name in polls:
            continue
        if name in _SCRIPT_CALLS:
            sha = c.command.split(" ", 2)[1].strip('"')
            name = shas.get(sha, f"script {sha[:8]}")
            step = _STEP_OF.get((name, seen[name]), name)
            seen[name] += 1
            out.append((step, name, 1))
        elif name in _BROKER:
            out.append(("message", name, 1))
        elif _background(c, apis_key):
            out.append(("other", name, 1))
        else:
            out.append((step, name, 1))
    return out


def _background(c: Monitored, apis_key: str) -> bool:
    """A command the stack sends on its own: an api's heartbeat, a worker's Celery event."""
    parts = c.command.split(" ")
    return (len(parts) > 1 and parts[1] == apis_key) or (
        c.name == "publish" and len(parts) > 1 and "celeryev" in parts[1]
    )


def summary(by_step: Mapping[str, Counter[str]], n: int) -> dict[str, Any]:
    """Per send: each step's commands, and each script's or command's within it."""
    steps: dict[str, dict[str, Any]] = {
        step: {
            "redisCommands": round(sum(calls.values()) / n, 2),
            "by": {name: round(count / n, 2) for name, count in calls.most_common()},
        }
        for step, calls in by_step.items()
    }
    total = sum(sum(calls.values()) for calls in by_step.values()) / n
    return {
        "per": f"send+wait into a fresh session, by step (MONITOR of {n} more sends)",
        "units": n,
        "redisCommands": round(total, 2),
        "steps": steps,
    }


def steps_markdown(docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-step table of a latency run's JSON (nothing when it has none)."""
    found = [d["costs"]["sendWait"]["steps"] for d in docs if _has_steps(d)]
    if not found:
        return []
    steps = found[0]["steps"]
    names = list(steps)
    lines = [
        "",
        f"| {found[0]['per']} | " + " | ".join(names) + " | all |",
        "|---" * (len(names) + 2) + "|",
        "| Redis commands | "
        + " | ".join(f"{steps[s]['redisCommands']:g}" for s in names)
        + f" | {found[0]['redisCommands']:g} |",
        "| of them | "
        + " | ".join(
            ", ".join(f"{k} {v:g}" for k, v in steps[s]["by"].items()) or "—" for s in names
        )
        + " | |",
    ]
    return lines


def _has_steps(doc: Mapping[str, Any]) -> bool:
    return "steps" in doc.get("costs", {}).get("sendWait", {})
