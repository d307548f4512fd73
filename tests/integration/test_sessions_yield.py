"""`sessions_yield` end to end: real api, real worker, real Redis.

A parent that spawns children and yields ends its turn (status ok, `yielded`); the
children's announces start its next run, batched: children that end within the batching
window (`yield_wake.BATCH_WINDOW_S`, 1 s) make one message. With nothing pending the call
is refused with OpenClaw's text. A worker killed with -9 while the parent waits loses
nothing and doubles nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.flows.yield_wake import BATCH_WINDOW_S, WAKE_STEP
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools.sessions_yield import ALREADY_PENDING, BAD_WAIT_FOR, NOTHING_PENDING

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"


def wait_until(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def tool_line(name: str, args: dict[str, Any]) -> str:
    return f"/tool {name} {json.dumps(args)}"


def child_task(result: str, sleep_s: float) -> str:
    return f"work\n/sleep {sleep_s}\n/reply {result}"


def invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> dict[str, Any]:
    """Call a tool over /tools/invoke and return its result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def announce_messages(services: Services, key: str = MAIN) -> list[dict[str, Any]]:
    """The user messages of a session that carry sub-agent announces."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if m.get("role") == "user"
        and (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


def ended(services: Services, run_id: str, timeout_s: float = 30) -> RunRecord:
    def check() -> RunRecord | None:
        rec = services.store.runs.get(run_id)
        return rec if rec is not None and rec.terminal else None

    found: RunRecord = wait_until(check, timeout_s, what=f"run {run_id} to end")
    return found


# -- through the model loop -----------------------------------------------------------------


def test_three_children_then_yield_give_one_follow_up_run_with_all_results(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """Spawn three and yield in one answer: the turn ends yielded; one next run holds all three."""
    spawns = [
        tool_line("sessions_spawn", {"task": child_task(f"result-{c}", 1.5), "label": f"job-{c}"})
        for c in "ABC"
    ]
    message = "\n".join([*spawns, tool_line("sessions_yield", {"message": "wait for A-C"})])
    parent = rpc("agent", sessionKey="main", message=message)
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=15_000)
    assert outcome["status"] == "ok"
    assert "reply" not in outcome  # no reply: the turn was yielded
    rec = services.store.runs.get(parent["runId"])
    assert rec is not None and rec.yielded and not rec.reply
    entry = services.store.sessions.get(MAIN)
    assert entry is not None
    assert entry.get("yieldedRunId") == parent["runId"]
    assert entry.get("yieldMessage") == "wait for A-C"
    # The transcript: the call and the yield's tool return, no assistant reply after it.
    roles = [m["role"] for m in services.store.transcripts.all(MAIN)]
    assert roles == ["user", "assistant", *["toolResult"] * 4]
    yielded = services.store.transcripts.all(MAIN)[-1]
    assert yielded["toolName"] == "sessions_yield"
    assert "yielded" in json.dumps(yielded["content"])

    [wake] = wait_until(lambda: announce_messages(services), what="the wake message")
    text = str(wake["content"])
    assert text.startswith("3 subagent results arrived while this session was yielded.")
    for c in "ABC":
        assert f"Result: result-{c}" in text
        assert f'A subagent task "job-{c}" just completed successfully.' in text
    # The wake run answers (echo: the message itself) and the session is no longer yielded.
    wait_until(
        lambda: services.store.transcripts.all(MAIN)[-1]["role"] == "assistant",
        what="the wake run's answer",
    )
    time.sleep(BATCH_WINDOW_S + 1.5)  # nothing else arrives: exactly one follow-up
    assert len(announce_messages(services)) == 1
    roles = [m["role"] for m in services.store.transcripts.all(MAIN)]
    assert roles == ["user", "assistant", *["toolResult"] * 4, "user", "assistant"]
    assert not services.store.yields.is_yielded(MAIN)
    assert services.store.yields.open_wake(MAIN) == ""
    assert services.store.spawns.active_children(MAIN) == []
    assert services.store.runs.lane_holder(MAIN) is None  # the wake run ended


def test_yield_with_nothing_pending_is_refused_and_the_turn_goes_on(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """No pending child: status error with OpenClaw's text; the run continues and answers."""
    parent = rpc("agent", sessionKey="main", message=tool_line("sessions_yield", {}))
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=15_000)
    assert outcome["status"] == "ok"
    assert json.loads(outcome["reply"]) == {"status": "error", "error": NOTHING_PENDING}
    rec = services.store.runs.get(parent["runId"])
    assert rec is not None and not rec.yielded
    assert not services.store.yields.is_yielded(MAIN)


# -- over /tools/invoke -----------------------------------------------------------------------


def test_tools_invoke_refuses_with_nothing_pending(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    assert invoke(client, "sessions_yield") == {"status": "error", "error": NOTHING_PENDING}
    assert not services.store.yields.is_yielded(MAIN)


def test_tools_invoke_yield_wakes_the_session_with_its_children_results(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Over HTTP the session is marked yielded; its children's announces start one run."""
    for c in "XY":
        accepted = invoke(client, "sessions_spawn", task=child_task(f"out-{c}", 1.0), label=c)
        assert accepted["status"] == "accepted"
    result = invoke(client, "sessions_yield", message="resume with X and Y")
    assert result == {"status": "yielded"}  # OpenClaw 2026.9.6: no `message` field
    entry = services.store.sessions.get(MAIN)
    assert entry is not None and entry.get("yieldedAt") and not entry.get("yieldedRunId")
    assert entry.get("yieldMessage") == "resume with X and Y"
    assert invoke(client, "sessions_yield") == {  # a yield waits already
        "status": "already_pending",
        "message": ALREADY_PENDING,
        "pendingChildren": 2,
    }
    [wake] = wait_until(lambda: announce_messages(services), what="the wake message")
    assert "Result: out-X" in wake["content"] and "Result: out-Y" in wake["content"]
    answered = wait_until(
        lambda: [m for m in services.store.transcripts.all(MAIN) if m["role"] == "assistant"],
        what="the wake run's answer",
    )
    assert "Result: out-X" in str(answered[0]["content"])
    time.sleep(BATCH_WINDOW_S + 1)
    assert len(announce_messages(services)) == 1
    assert not services.store.yields.is_yielded(MAIN)


def test_children_that_announce_nothing_are_not_waited_for(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Only a fire-and-forget child pending (expectsCompletionMessage false): refused."""
    task = child_task("quiet", 2.0)
    accepted = invoke(client, "sessions_spawn", task=task, expectsCompletionMessage=False)
    assert accepted["status"] == "accepted"
    assert services.store.spawns.active_children(MAIN) == [accepted["childSessionKey"]]
    assert invoke(client, "sessions_yield") == {"status": "error", "error": NOTHING_PENDING}
    assert not services.store.yields.is_yielded(MAIN)
    ended(services, accepted["runId"])


def test_completion_target_parent_children_join_the_wake_too(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Children whose result is a private turn of the parent: batched into one wake run."""
    runs = [
        invoke(client, "sessions_spawn", task=child_task(f"p-{c}", 1.0), completionTarget="parent")
        for c in "12"
    ]
    assert all(r["status"] == "accepted" for r in runs)
    assert invoke(client, "sessions_yield")["status"] == "yielded"
    [wake] = wait_until(lambda: announce_messages(services), what="the wake message")
    assert "Result: p-1" in wake["content"] and "Result: p-2" in wake["content"]
    time.sleep(BATCH_WINDOW_S + 1.5)
    assert len(announce_messages(services)) == 1  # no private turn of its own per child
    assert not services.store.yields.is_yielded(MAIN)


def test_a_yield_whose_last_child_ends_silently_ends_without_a_wake(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """ANNOUNCE_SKIP: nothing to bring back; the session stops waiting, no run starts."""
    accepted = invoke(client, "sessions_spawn", task=child_task("ANNOUNCE_SKIP", 1.0))
    assert invoke(client, "sessions_yield")["status"] == "yielded"
    assert services.store.yields.is_yielded(MAIN)
    ended(services, accepted["runId"])
    wait_until(lambda: not services.store.yields.is_yielded(MAIN), what="the yield to end")
    time.sleep(BATCH_WINDOW_S + 0.5)
    assert announce_messages(services) == []
    assert services.store.runs.lane_holder(MAIN) is None


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test's config (indirect parametrisation), empty by default."""
    return dict(getattr(request, "param", {}))


NESTED = {"agents": {"defaults": {"subagents": {"maxSpawnDepth": 2}}}}


@pytest.mark.parametrize("config_data", [NESTED], indirect=True)
def test_an_orchestrator_yields_and_completes_once_its_wake_run_answers(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A sub-agent that spawns two leaves and yields is paused, not done: its requester
    hears nothing until the orchestrator's wake run (both leaves' results) answers."""
    leaves = [
        tool_line("sessions_spawn", {"task": child_task(f"g-{n}", 1.0), "label": f"g{n}"})
        for n in (1, 2)
    ]
    task = "\n".join(["orchestrate", *leaves, tool_line("sessions_yield", {"message": "g"})])
    accepted = invoke(client, "sessions_spawn", task=task, label="orch")
    orchestrator = accepted["childSessionKey"]
    first = ended(services, accepted["runId"])
    assert first.status == "ok" and first.yielded
    assert announce_messages(services) == []  # paused: no completion for the requester
    [wake] = wait_until(lambda: announce_messages(services, orchestrator), what="its wake")
    assert "Result: g-1" in wake["content"] and "Result: g-2" in wake["content"]
    [done] = wait_until(lambda: announce_messages(services), what="the orchestrator's announce")
    assert done["content"].startswith('A subagent task "orch" just completed successfully.')
    assert "Result: g-1" in done["content"]  # its wake run's answer (echo: the results)
    linked = services.store.runs.get(accepted["runId"])
    assert linked is not None and linked.wake_run_id
    wake_run = services.store.runs.get(linked.wake_run_id)
    assert wake_run is not None and wake_run.session_key == orchestrator
    assert wake_run.extra_system_prompt and "Your note for this turn: g" in (
        wake_run.extra_system_prompt
    )
    assert wake_run.meta.get("spawnId") == first.meta.get("spawnId")
    time.sleep(BATCH_WINDOW_S + 1)
    assert len(announce_messages(services)) == 1
    assert len(announce_messages(services, orchestrator)) == 1
    assert services.store.spawns.active_children(MAIN) == []
    assert not services.store.yields.is_yielded(orchestrator)


@pytest.mark.parametrize("config_data", [NESTED], indirect=True)
def test_a_leaf_is_not_offered_the_tool(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A leaf spawns nothing, so it has nothing to wait for: the tool is not offered."""
    orch = invoke(client, "sessions_spawn", task="go\n/sleep 1\n/reply done")
    ended(services, orch["runId"])
    orchestrator = orch["childSessionKey"]
    leaf = invoke(client, "sessions_spawn", orchestrator, task=child_task("leaf-out", 1.5))
    assert leaf["status"] == "accepted"
    refused = client.post(
        "/tools/invoke",
        json={"tool": "sessions_yield", "args": {}, "sessionKey": leaf["childSessionKey"]},
    )
    assert refused.status_code == 404
    offered = client.post(
        "/tools/invoke",
        json={"tool": "sessions_yield", "args": {}, "sessionKey": orchestrator},
    )
    assert offered.status_code == 200  # an orchestrator is offered it
    assert offered.json()["result"]["status"] == "yielded"
    [wake] = wait_until(lambda: announce_messages(services, orchestrator), what="its wake")
    assert "Result: leaf-out" in wake["content"]


def test_announces_after_the_take_start_the_next_wake(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Children that end far apart: each lands in its own wake, none is lost or doubled."""
    invoke(client, "sessions_spawn", task=child_task("early", 0.2), label="early")
    invoke(client, "sessions_spawn", task=child_task("late", 0.2 + BATCH_WINDOW_S + 3), label="l")
    assert invoke(client, "sessions_yield")["status"] == "yielded"
    wait_until(lambda: len(announce_messages(services)) == 2, what="two wakes", timeout_s=40)
    first, second = announce_messages(services)
    assert "Result: early" in first["content"] and "late" not in first["content"]
    assert "Result: late" in second["content"]
    wait_until(lambda: not services.store.yields.is_yielded(MAIN), what="the yield to end")
    time.sleep(BATCH_WINDOW_S + 1)
    assert len(announce_messages(services)) == 2


def test_a_wake_step_run_twice_starts_one_run(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """The step is idempotent: run again (a sweep's re-send) it starts nothing new."""
    invoke(client, "sessions_spawn", task=child_task("once", 0.2))
    invoke(client, "sessions_yield")
    wake_id = wait_until(lambda: services.store.yields.open_wake(MAIN), what="a wake to open")
    wait_until(
        lambda: services.store.yields.get_wake(wake_id).get("status") == "started",
        what="the wake to start its run",
    )
    first = services.store.yields.get_wake(wake_id)["runId"]
    services.queue.enqueue(WAKE_STEP, MAIN, wake_id)
    time.sleep(1.5)
    assert services.store.yields.get_wake(wake_id)["runId"] == first
    assert len(announce_messages(services)) == 1


# -- kill -9 of the worker while yielded --------------------------------------------------------


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.mark.faults
@pytest.mark.parametrize("moment", ["children_running", "wake_pending"])
def test_worker_kill_while_yielded_loses_and_doubles_nothing(
    switchboard_procs: Callable[..., subprocess.Popen[bytes]], services: Services, moment: str
) -> None:
    """kill -9 the worker while the children run (or while the wake step waits out its
    window); a new worker and beat take over: exactly one follow-up run with all results."""
    first = switchboard_procs("worker", "--concurrency", "8")
    sleep_s = 2.5 if moment == "children_running" else 0.3
    spawns = [
        tool_line("sessions_spawn", {"task": child_task(f"r-{c}", sleep_s), "label": c})
        for c in "ABC"
    ]
    message = "\n".join([*spawns, tool_line("sessions_yield", {})])
    parent = start_run(services, RunRequest(session_key=MAIN, message=message))
    rec = ended(services, str(parent["runId"]))
    assert rec.status == "ok" and rec.yielded
    children = services.store.spawns.active_children(MAIN)
    assert len(children) == 3
    child_runs: list[str] = []
    wake_id = ""
    if moment == "children_running":
        wait_until(
            lambda: all(
                services.store.runs.status(services.store.runs.lane_holder(c) or "") == "running"
                for c in children
            ),
            what="the children to run",
        )
        child_runs = [services.store.runs.lane_holder(c) or "" for c in children]
    else:
        # All three announces stashed, the wake step waiting out its window.
        wake_id = wait_until(
            lambda: (
                services.store.yields.inbox_length(MAIN) == 3
                and services.store.yields.open_wake(MAIN)
            ),
            what="a wake with three announces",
        )
    _kill(first)
    if wake_id:  # the step died with the worker, in its window: nothing was taken
        assert services.store.yields.open_wake(MAIN) == wake_id
        assert services.store.yields.get_wake(wake_id) == {}
    switchboard_procs("worker", "--concurrency", "8")
    switchboard_procs("beat")
    [wake] = wait_until(lambda: announce_messages(services), timeout_s=60, what="the wake")
    for c in "ABC":
        assert f"Result: r-{c}" in wake["content"]
    wait_until(lambda: not services.store.yields.is_yielded(MAIN), what="the yield to end")
    wait_until(
        lambda: services.store.transcripts.all(MAIN)[-1]["role"] == "assistant",
        what="the wake run's answer",
        timeout_s=30,
    )
    time.sleep(BATCH_WINDOW_S + 4)  # a re-sent step or a second wake would show by now
    assert len(announce_messages(services)) == 1
    # Every child's slot is freed. A child whose announce step died between stashing its
    # announce and freeing its slot is finished by the sweep from its run's outbox (its
    # grace is 15 s from the child's end), so this may take that long.
    wait_until(
        lambda: services.store.spawns.active_children(MAIN) == [],
        timeout_s=30,
        what="every child's slot to be freed",
    )
    assistants = [m for m in services.store.transcripts.all(MAIN) if m["role"] == "assistant"]
    assert len(assistants) == 2  # the yielding turn's calls, the wake run's answer
    for run_id in child_runs:  # each child ran again on the new worker, once
        child = services.store.runs.get(run_id)
        assert child is not None and child.status == "ok" and child.attempt == 2


# -- OpenClaw 2026.9.6: acknowledgment, waitFor "message", already_pending -------------------


def test_an_acknowledgment_is_the_yielding_turns_reply(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """`acknowledgment` comes back in the result and is the yielded run's visible reply."""
    spawn = tool_line("sessions_spawn", {"task": child_task("late", 1.0)})
    ack = tool_line("sessions_yield", {"acknowledgment": "On it, back soon."})
    parent = rpc("agent", sessionKey="main", message=f"{spawn}\n{ack}")
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=15_000)
    assert (outcome["status"], outcome["reply"]) == ("ok", "On it, back soon.")
    rec = services.store.runs.get(parent["runId"])
    assert rec is not None and rec.yielded
    yielded = services.store.transcripts.all(MAIN)[-1]
    assert json.loads(yielded["content"][0]["text"]) == {
        "status": "yielded",
        "acknowledgment": "On it, back soon.",
    }
    wait_until(lambda: announce_messages(services), what="the wake message")


def test_wait_for_message_yields_without_children_until_the_next_message(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """`waitFor: "message"` with nothing pending ends the turn (not paused: no child will
    wake it); the next message (here a plain send) starts the next turn."""
    key = "agent:main:hook:waiter"
    parent = rpc(
        "agent", sessionKey=key, message=tool_line("sessions_yield", {"waitFor": "message"})
    )
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=15_000)
    assert outcome["status"] == "ok" and "reply" not in outcome
    rec = services.store.runs.get(parent["runId"])
    assert rec is not None and not rec.yielded
    assert not services.store.yields.is_yielded(key)  # nothing to wake it but a message
    yielded = services.store.transcripts.all(key)[-1]
    assert json.loads(yielded["content"][0]["text"]) == {"status": "yielded"}
    nxt = rpc("agent", sessionKey=key, message="/reply continued")
    assert rpc("agent.wait", runId=nxt["runId"], timeoutMs=15_000)["reply"] == "continued"


def test_tools_invoke_wait_for_message_and_a_bad_wait_for(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Over HTTP `waitFor: "message"` answers yielded with nothing pending; another value
    is refused."""
    assert invoke(client, "sessions_yield", waitFor="message", acknowledgment="ok!") == {
        "status": "yielded",
        "acknowledgment": "ok!",
    }
    refused = invoke(client, "sessions_yield", waitFor="children")
    assert refused == {"status": "error", "error": BAD_WAIT_FOR}
    assert not services.store.yields.is_yielded(MAIN)


def test_a_second_yield_in_a_run_answers_already_pending(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """A run of a session already yielded on a pending child is told `already_pending`
    and its turn goes on."""
    invoke(client, "sessions_spawn", task=child_task("slow", 4.0))
    assert invoke(client, "sessions_yield")["status"] == "yielded"
    run = rpc("agent", sessionKey="main", message=tool_line("sessions_yield", {}))
    outcome = rpc("agent.wait", runId=run["runId"], timeoutMs=15_000)
    assert json.loads(outcome["reply"]) == {
        "status": "already_pending",
        "message": ALREADY_PENDING,
        "pendingChildren": 1,
    }
    rec = services.store.runs.get(run["runId"])
    assert rec is not None and not rec.yielded


@pytest.mark.parametrize("config_data", [NESTED], indirect=True)
def test_a_subagent_waiting_for_a_message_is_announced_and_continued_by_a_send(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A sub-agent yielding with `waitFor: "message"` and no child of its own: its turn
    ends (its acknowledgment is the result its parent hears), and its parent's
    `sessions_send` starts its next turn."""
    ack = {"waitFor": "message", "acknowledgment": "ready for the data"}
    task = f"wait for the data\n{tool_line('sessions_yield', ack)}"
    accepted = invoke(client, "sessions_spawn", task=task, label="waiter")
    child_run = ended(services, accepted["runId"])
    assert (child_run.status, child_run.reply, child_run.yielded) == (
        "ok",
        "ready for the data",
        False,
    )
    [told] = wait_until(lambda: announce_messages(services), what="the parent to hear")
    assert "ready for the data" in told["content"]
    child = accepted["childSessionKey"]
    resp = client.post(
        "/tools/invoke",
        json={
            "tool": "sessions_send",
            "args": {"sessionKey": child, "message": "/reply got it", "timeoutSeconds": 20},
        },
    )
    assert resp.json()["result"]["reply"] == "got it"
