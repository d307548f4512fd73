"""The fault tests' kit: the product's own processes (`switchboard worker | beat | api`) as
subprocesses on one Redis, and the checks that prove nothing was lost or doubled.

Every process runs in its own process group; the tests kill, stop and restart them on
purpose. Timings are short (lane lease 2 s, sweep every 0.5 s) so recovery is quick.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from switchboard.shared.config import Settings, parse_config
from switchboard.shared.delivery import records as delivery_records
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.flows.a2a_flow import get_flow
from switchboard.shared.services import Services
from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.runs import RunRecord
from switchboard.wiring import build_services
from switchboard.workers.app import create_celery_app
from switchboard.workers.queue import CeleryQueue
from switchboard_testkit import store_reads
from switchboard_testkit.redis_sentinel import (
    DOWN_AFTER_MS,
    RedisSentinelGroup,
    redis_sentinel_missing,
)
from switchboard_testkit.webhook_receiver import WebhookReceiver

TOKEN = "faults-token"
LANE_LEASE_S = 2
SWEEP_INTERVAL_S = 0.5
# The chat channel every announce in these tests goes to (a webhook on loopback).
CHANNEL = "relay"


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def base_config(webhook_url: str) -> dict[str, Any]:
    """Every session visible to its agent, announces to a webhook, fast delivery retries."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "channels": {CHANNEL: {"webhook": {"url": webhook_url}}},
        # A loopback POST answers in milliseconds, but a loaded 2-core machine running a
        # whole cluster can take over a second to get to it: a timeout is not what these
        # tests are about (test_delivery is).
        "delivery": {"maxAttempts": 4, "backoffBaseS": 0.3, "backoffMaxS": 1, "timeoutS": 5},
        "session": {"agentToAgent": {"maxPingPongTurns": 2}},
        "agents": {"defaults": {"subagents": {"maxChildrenPerAgent": 10}}},
    }


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` laid over ``base``, nested objects merged."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def wait_until(
    check: Callable[[], Any],
    timeout_s: float,
    what: str,
    every_s: float = 0.1,
    state: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` (and showing
    ``state()``) after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            shown = f"; state: {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}{shown}")
        time.sleep(every_s)


@contextlib.contextmanager
def redis_sentinel_group(
    where: Path, replicas: int = 1, down_after_ms: int = DOWN_AFTER_MS
) -> Iterator[RedisSentinelGroup]:
    """A private primary, ``replicas`` replicas and three sentinels under ``where``, ready
    to fail over (a node is down to a sentinel after ``down_after_ms`` without an answer);
    skips the test where this machine cannot run a Sentinel group."""
    missing = redis_sentinel_missing()
    if missing:
        pytest.skip(missing)
    with RedisSentinelGroup(where, replicas=replicas, down_after_ms=down_after_ms) as group:
        yield group


@dataclass
class Proc:
    """One started `switchboard <command>` and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """Still running."""
        return self.popen.poll() is None

    def output(self) -> str:
        """Everything it logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# A process log's ERROR lines shown in a failure message: this many, each cut to this long.
ERROR_LINES_SHOWN = 20
ERROR_LINE_CHARS = 6000


def error_lines(log: str) -> list[str]:
    """The log's records at ERROR or above (JSON lines, their tracebacks inside), the first
    `ERROR_LINES_SHOWN` of them, each cut to `ERROR_LINE_CHARS`."""
    found = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        try:
            level = json.loads(line).get("level")
        except (ValueError, AttributeError):
            continue
        if level in ("error", "critical"):
            found.append(line[:ERROR_LINE_CHARS])
            if len(found) == ERROR_LINES_SHOWN:
                break
    return found


@dataclass
class Cluster:
    """The product's processes on one Redis, with test-side services for the checks."""

    redis_url: str
    workdir: Path
    config: dict[str, Any]
    env_extra: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    # The Celery broker when it is not the Redis (e.g. amqp://…/<vhost>).
    broker_url: str | None = None

    def __post_init__(self) -> None:
        self.config_path = self.workdir / "config.json"
        self.config_path.write_text(json.dumps(self.config))
        self.settings = Settings(
            redis_url=self.redis_url,
            broker_url=self.broker_url,
            token=TOKEN,
            data_dir=self.workdir / "data",
            sweep_interval_s=SWEEP_INTERVAL_S,
            lane_lease_s=LANE_LEASE_S,
        )
        self.services: Services = build_services(
            self.settings,
            queue=CeleryQueue(create_celery_app(self.settings)),
            config=parse_config(self.config),
        )

    # -- processes ------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The environment every process of the cluster gets."""
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SWITCHBOARD_REDIS_URL": self.redis_url,
            "SWITCHBOARD_TOKEN": TOKEN,
            "SWITCHBOARD_DATA_DIR": str(self.workdir / "data"),
            "SWITCHBOARD_CONFIG": str(self.config_path),
            "SWITCHBOARD_LANE_LEASE_S": str(LANE_LEASE_S),
            "SWITCHBOARD_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S),
            "SWITCHBOARD_LOG_LEVEL": "INFO",
            **({"SWITCHBOARD_BROKER_URL": self.broker_url} if self.broker_url else {}),
            **self.env_extra,
        }

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        """Start `switchboard <args>` in its own process group, logging to a file; `env`
        is laid over the cluster's."""
        log = self.workdir / f"{len(self.procs):02d}-{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "switchboard", *args],
                env={**self.env, **(env or {})},
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def worker(self, concurrency: int = 32, node: str | None = None) -> Proc:
        """A worker, returned once it consumes (its startup sweep has run); `node` is its
        Celery node name (several workers at once need distinct ones on RabbitMQ)."""
        named = ("--node", node) if node else ()
        proc = self.start("worker", "worker", "--concurrency", str(concurrency), *named)
        wait_until(lambda: self._ready(proc, " ready."), 60, "the worker to be ready", 0.2)
        return proc

    def beat(self, data_dir: Path | None = None) -> Proc:
        """Celery beat scheduling the recovery sweep every SWEEP_INTERVAL_S; a second beat
        needs a `data_dir` of its own (its schedule file)."""
        env = {"SWITCHBOARD_DATA_DIR": str(data_dir)} if data_dir else None
        return self.start("beat", "beat", env=env)

    def api(self, port: int | None = None) -> tuple[Proc, str]:
        """`switchboard api` on a loopback port, returned once /healthz answers."""
        port = port or free_port()
        proc = self.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.alive(), f"api exited:\n{proc.output()[-3000:]}"
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the api to answer /healthz", 0.2)
        return proc, url

    def _ready(self, proc: Proc, marker: str) -> bool:
        assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"
        return marker in proc.output()

    def kill(self, proc: Proc) -> None:
        """SIGKILL the process and everything in its group (no cleanup runs)."""
        if proc.alive():
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(10)

    def stop(self, proc: Proc, timeout_s: float = 20) -> None:
        """SIGTERM (a graceful stop), SIGKILL after ``timeout_s``."""
        if proc.alive():
            os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(proc)

    def stop_all(self) -> None:
        """Kill whatever still runs."""
        for proc in self.procs:
            if proc.alive():
                self.kill(proc)

    def logs(self, tail: int = 4000) -> str:
        """For failure messages: every process's ERROR lines (a 500's traceback is one,
        however long ago it was logged), then the end of its log."""
        parts = []
        for proc in self.procs:
            text = proc.output()
            errors = error_lines(text)
            shown = f"errors ({len(errors)}):\n" + "\n".join(errors) + "\n" if errors else ""
            parts.append(f"--- {proc.log.name}\n{shown}end:\n{text[-tail:]}")
        return "\n".join(parts)

    # -- state ------------------------------------------------------------------------
    @property
    def redis(self) -> redis.Redis:
        """The test-side Redis client."""
        return self.services.store.redis

    def _ids(self, kind: str) -> list[str]:
        """The ids of every record of a kind (``r:`` runs, ``flow:``, ``spawn:``) in every
        slot group's keys."""
        found = []
        for group in self.services.store.ks.every_group():
            head = f"{group.prefix}{kind}"
            found += [as_text(k)[len(head) :] for k in self.redis.scan_iter(f"{head}*", count=1000)]
        return sorted(found)

    def run_ids(self) -> list[str]:
        """Every run recorded."""
        return [i for i in self._ids("r:") if not i.endswith(":waiters")]

    def runs(self) -> list[RunRecord]:
        """Every run record."""
        found = self.services.store.runs.get_many(self.run_ids())
        return [r for r in found if r is not None]

    def run_hash(self, run_id: str) -> dict[str, str]:
        """A run's raw fields (userSeq is not on RunRecord)."""
        return codec.decode_hash(self.redis.hgetall(self.services.store.ks.run(run_id)))

    def events(self, event_type: str) -> list[dict[str, Any]]:
        """The data of every ``event_type`` event in the events stream, oldest first (a
        run's end step writes its ``run.ended`` there in the same script, only when the
        end applies)."""
        found = store_reads.events(self.services.store, event_type)
        return [{k: v for k, v in e.items() if k != "type"} for e in found]

    def flows(self) -> list[dict[str, Any]]:
        """Every reply-back flow, as flows.get shows it."""
        ids = self._ids("flow:")
        return [f for f in (get_flow(self.services, i) for i in ids) if f is not None]

    def spawns(self) -> list[dict[str, Any]]:
        """Every spawn record's fields."""
        records = self.services.store.spawns
        found = records.get_many(self._ids("spawn:"))
        return [dict(r.fields) for r in found if r is not None]

    def batches(self) -> list[dict[str, Any]]:
        """Every batch record's fields."""
        ids = [i for i in self._ids("batch:") if not i.endswith(":done")]
        records = self.services.store.spawns
        return [dict(b.fields) for b in (records.get_batch(i) for i in ids) if b is not None]

    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery record."""
        ids = self._ids("dlv:")
        found = (delivery_records.get(self.services, i) for i in ids)
        return [d for d in found if d is not None]


# -- the checks -------------------------------------------------------------------------------


def count_by(values: Iterator[Any] | list[Any]) -> dict[Any, int]:
    """A plain dict of counts (readable in assertion messages)."""
    return dict(Counter(values))


def assert_transcripts_exact(cluster: Cluster, runs: list[RunRecord]) -> int:
    """Every session's transcript is exactly its runs' turns plus its announces, once each.

    Sequence numbers run 1..n without gaps. Each run owns the block from its user message
    (``userSeq``) to the next user message: ``[user, assistant]`` for a plain answer, or
    ``[user, assistant(k toolCalls), k toolResults, assistant]`` when it called k tools;
    the user text is the run's message and the last assistant text is the run's reply.
    Every other user message is a sub-agent announce, each spawn or batch at most once.
    Returns how many messages were checked."""
    by_session: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_session.setdefault(run.session_key, []).append(run)
    checked = 0
    for session, session_runs in by_session.items():
        transcript = cluster.services.store.transcripts.all(session)
        if not transcript and all(r.status != "ok" for r in session_runs):
            continue  # e.g. an archived sub-agent session: checked through its export
        checked += len(transcript)
        _assert_one_transcript(cluster, session, transcript, session_runs)
    return checked


def _assert_one_transcript(
    cluster: Cluster, session: str, transcript: list[dict[str, Any]], runs: list[RunRecord]
) -> None:
    seqs = [m["__openclaw"]["seq"] for m in transcript]
    assert seqs == list(range(1, len(transcript) + 1)), f"{session}: sequence {seqs}"
    owner: dict[int, RunRecord] = {}
    for run in runs:
        user_seq = cluster.run_hash(run.run_id).get("userSeq")
        assert user_seq, f"{session}: run {run.run_id} never appended its message"
        assert int(user_seq) not in owner, f"{session}: two runs share user message {user_seq}"
        owner[int(user_seq)] = run
    starts = [i for i, m in enumerate(transcript) if m["role"] == "user"]
    announces = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(transcript)
        block = transcript[start:end]
        run = owner.pop(start + 1, None)
        if run is None:
            provenance = block[0].get("provenance") or {}
            assert provenance.get("sourceTool") == "subagent_announce", (
                f"{session}: user message {start + 1} belongs to no run: {block[0]}"
            )
            assert len(block) == 1, f"{session}: an announce followed by {block[1:]}"
            announces.append(block[0]["content"])
            continue
        _assert_run_block(session, run, block)
    assert not owner, f"{session}: runs without their user message: {list(owner.values())}"
    repeated = [text for text, n in Counter(announces).items() if n > 1]
    assert not repeated, f"{session}: announce appended more than once: {repeated}"


def _assert_run_block(session: str, run: RunRecord, block: list[dict[str, Any]]) -> None:
    where = f"{session} run {run.run_id} (attempt {run.attempt})"
    assert run.message is not None and block[0]["content"] == run.message["content"], where
    roles = [m["role"] for m in block]
    calls = [
        b for b in (block[1]["content"] if len(block) > 1 else []) if b.get("type") == "toolCall"
    ]
    k = len(calls)
    expected = ["user", "assistant"] if k == 0 else ["user", "assistant"] + ["toolResult"] * k
    if k:
        expected.append("assistant")
    assert roles == expected, f"{where}: roles {roles}"
    result_ids = [m["toolCallId"] for m in block if m["role"] == "toolResult"]
    assert result_ids == [c["id"] for c in calls], f"{where}: tool results {result_ids}"
    last = block[-1]
    texts = [b["text"] for b in last["content"] if b.get("type") == "text"]
    assert "".join(texts) == (run.reply or ""), f"{where}: reply {texts} vs {run.reply!r}"


def idempotency_counts(webhook: WebhookReceiver) -> Counter[str]:
    """How often each Idempotency-Key reached the receiver (2xx answers only)."""
    return Counter(
        r.headers.get("idempotency-key", "") for r in webhook.received if 200 <= r.status < 300
    )


# -- a failover under load: the api probed while it runs, and what it must leave ----------------

# An answer while the store fails over comes within this, or the test fails.
FAILOVER_REQUEST_TIMEOUT_S = 15.0


def api_post(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    """POST ``body`` to an api with the token; the answer and how long it took."""
    started = time.monotonic()
    resp = httpx.post(
        f"{url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=FAILOVER_REQUEST_TIMEOUT_S + 5,
    )
    return resp, time.monotonic() - started


def api_send(url: str, session: str, message: str) -> str:
    """A run started by `agent` on an api (answered 200); its id."""
    resp, _ = api_post(
        url, "/rpc", {"method": "agent", "params": {"sessionKey": session, "message": message}}
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["runId"])


class FailoverProber:
    """Sends, lists and health checks in a loop while the store fails over: each answer
    is recorded with its status, Retry-After and how long it took."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[str, int, str | None, float]] = []
        self.acknowledged: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> FailoverProber:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(FAILOVER_REQUEST_TIMEOUT_S * 2)

    def acknowledged_again(self, sends: int = 2, timeout_s: float = 30) -> None:
        """Wait until ``sends`` more sends are answered 200 from now on (those before
        may have reached a shard that was not failing over)."""
        seen = len(self.acknowledged)
        wait_until(
            lambda: len(self.acknowledged) >= seen + sends, timeout_s, "sends to succeed again", 0.2
        )

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            body = {"sessionKey": f"during-{n % 4}", "message": f"during {n}"}
            for name, path, payload in (
                ("agent", "/rpc", {"method": "agent", "params": body}),
                ("sessions.list", "/rpc", {"method": "sessions.list", "params": {}}),
                ("tools/invoke", "/tools/invoke", {"tool": "sessions_list", "args": {}}),
            ):
                try:
                    resp, took = api_post(self.url, path, payload)
                except httpx.HTTPError as exc:
                    self.answers.append((name, -1, repr(exc), FAILOVER_REQUEST_TIMEOUT_S))
                    continue
                self.answers.append((name, resp.status_code, resp.headers.get("retry-after"), took))
                if name == "agent" and resp.status_code == 200:
                    self.acknowledged.append(str(resp.json()["runId"]))
            time.sleep(0.1)


def assert_failover_lost_nothing(
    cluster: Cluster, url: str, acknowledged: list[str], prober: FailoverProber
) -> None:
    """What a failover under load must leave: answers 200 or 503 with Retry-After within
    the timeout while it ran, new sends complete after it, and every run acknowledged
    (before, during, after) ends ok exactly once with an exact transcript; the 12 load
    sessions hold their two replies in order."""
    bad = [a for a in prober.answers if a[1] not in (200, 503)]
    assert not bad, f"answers other than 200 / 503 while failing over: {bad}"
    no_retry_after = [a for a in prober.answers if a[1] == 503 and not a[2]]
    assert not no_retry_after, f"503 without Retry-After: {no_retry_after}"
    slow = [a for a in prober.answers if a[3] >= FAILOVER_REQUEST_TIMEOUT_S]
    assert not slow, f"answers slower than {FAILOVER_REQUEST_TIMEOUT_S}s: {slow}"

    # New sends after the failover complete, on the same api and worker.
    after = [api_send(url, f"after-{i}", f"after {i}") for i in range(4)]
    for run_id in after:
        resp, _ = api_post(
            url, "/rpc", {"method": "agent.wait", "params": {"runId": run_id, "timeoutMs": 30_000}}
        )
        assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text

    everything = acknowledged + prober.acknowledged + after

    def all_ended() -> bool:
        try:
            found = cluster.services.store.runs.get_many(everything)
        except StoreUnavailable:  # the test's own client met the failover: read again
            return False
        return all(r is not None and r.terminal for r in found)

    wait_until(all_ended, 60, "every acknowledged run to end", 0.5)
    runs = [r for r in cluster.services.store.runs.get_many(everything) if r is not None]
    assert len(runs) == len(everything)
    failed = [(r.run_id, r.status, r.error) for r in runs if r.status != "ok"]
    assert not failed, f"runs that did not end ok: {failed}"
    print(f"attempts per run: {count_by(r.attempt for r in runs)}")
    checked = assert_transcripts_exact(cluster, runs)
    assert checked >= 2 * len(everything)
    for i in range(12):
        transcript = cluster.services.store.transcripts.all(f"agent:main:load-{i}")
        replies = [m["content"][0]["text"] for m in transcript if m["role"] == "assistant"]
        assert replies == [f"run {i}.0", f"run {i}.1"]
