"""State and broker on a Redis Sentinel group (``redis+sentinel://``): a private primary,
one replica and three sentinels, each a real redis-server on a port of its own.

The store, the CLI and a worker reach the primary through the sentinel URL; then the
primary is killed (kill -9) under load, and without restarting the api, the worker or the
beat: every run acknowledged before ends ok exactly once with exact transcripts, new sends
complete on the promoted replica, and the api answers 200 or 503 with Retry-After while
the sentinels fail over, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async, connect_plain
from switchboard.supervisor.redis_server import RedisServer, find_redis_server
from switchboard.supervisor.runfile import RUNFILE
from switchboard.testing.webhook_receiver import WebhookReceiver

# The fault tests' kit (its processes and checks) lives beside their conftest.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import (
    TOKEN,
    Cluster,
    assert_transcripts_exact,
    base_config,
    count_by,
    free_port,
    wait_until,
)

MASTER = "sbtest"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# An answer while the sentinels fail over comes within this, or the test fails.
REQUEST_TIMEOUT_S = 15.0


class _DataNode(RedisServer):
    """A redis-server with extra command-line settings (``--replicaof``)."""

    def __init__(self, data_dir: Path, extra: list[str]) -> None:
        super().__init__(data_dir)
        self.extra = extra

    def _argv(self) -> list[str]:
        return [*super()._argv(), *self.extra]


class _SentinelNode(RedisServer):
    """``redis-server sentinel.conf --sentinel`` (Sentinel rewrites its conf file)."""

    def __init__(self, data_dir: Path, primary_port: int) -> None:
        super().__init__(data_dir)
        self.conf = self.data_dir / "sentinel.conf"
        self.primary_port = primary_port

    def _argv(self) -> list[str]:
        assert self.executable is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 3000\n"
        )
        return [
            self.executable,
            str(self.conf),
            "--sentinel",
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir)),
            *("--logfile", str(self.log_path), "--daemonize", "no"),
        ]


@dataclass
class SentinelGroup:
    """The primary, its replica and the three sentinels watching them."""

    primary: RedisServer
    replica: RedisServer
    sentinels: list[RedisServer]

    @property
    def url(self) -> str:
        """The product's URL of database 0 of the group."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def named_primary(self) -> set[int]:
        """The primary's port as every sentinel names it right now."""
        ports = set()
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                _, port = client.sentinel_get_master_addr_by_name(MASTER)
                ports.add(int(port))
        return ports

    def ready(self) -> bool:
        """Every sentinel sees the replica and the two other sentinels; the replica synced."""
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                state = client.sentinel_master(MASTER)
            if state["num-slaves"] < 1 or state["num-other-sentinels"] < 2:
                return False
        with self.replica.client() as client:
            return bool(client.info("replication")["master_link_status"] == "up")

    def logs(self) -> str:
        """Every node's log tail (for failure messages)."""
        nodes = [self.primary, self.replica, *self.sentinels]
        return "\n".join(f"--- {n.log_path}\n{n.log_path.read_text()[-1500:]}" for n in nodes)


@contextlib.contextmanager
def _started_group(where: Path) -> Iterator[SentinelGroup]:
    """A private primary + replica + 3 sentinels under ``where``, ready to fail over."""
    try:
        find_redis_server()
    except Unavailable as exc:
        pytest.skip(f"no redis-server to run a Sentinel group: {exc}")
    primary = RedisServer(where / "primary")
    started: list[RedisServer] = []
    try:
        primary.start()
        started.append(primary)
        replica = _DataNode(where / "replica", ["--replicaof", "127.0.0.1", str(primary.port)])
        replica.start()
        started.append(replica)
        sentinels = []
        for n in range(3):
            node = _SentinelNode(where / f"sentinel{n}", primary.port)
            node.start()
            started.append(node)
            sentinels.append(node)
        group = SentinelGroup(primary, replica, sentinels)
        wait_until(group.ready, 20, "the sentinels to see the replica and each other", 0.2)
        yield group
    finally:
        for node in reversed(started):
            if node.pid is not None:
                os.kill(node.pid, signal.SIGKILL)
            node.stop()


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A group of the test's own (the failover tests change which node is the primary)."""
    with _started_group(tmp_path / "group") as group:
        yield group


@pytest.fixture(scope="module")
def steady_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A group the module's tests that fail nothing over share."""
    with _started_group(tmp_path_factory.mktemp("sentinel-group")) as group:
        yield group


@pytest.mark.integration
@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "plain"])
def test_store_round_trips_through_the_sentinel_url(
    steady_group: SentinelGroup, fast_paths: bool
) -> None:
    """The store's sync client (held connections or pooled), its probe client and its
    async client all reach the primary the sentinels name, and read their own writes."""
    store = Store.from_url(steady_group.url, fast_paths=fast_paths)
    try:
        store.ping()
        run = store.redis.pipeline()
        run.set("sentinel:probe", "written")
        run.incr(f"sentinel:count:{fast_paths}")
        assert run.execute() == [True, 1]
        with steady_group.primary.client() as primary:
            assert primary.get("sentinel:probe") == b"written"
        probe = connect_plain(steady_group.url, socket_timeout=3)
        assert probe.get("sentinel:probe") == b"written"
        probe.close()

        async def read_async() -> Any:
            client = connect_async(steady_group.url, socket_timeout=3)
            try:
                return await client.get("sentinel:probe")
            finally:
                await client.aclose()

        assert asyncio.run(read_async()) == b"written"
    finally:
        store.close()


@pytest.mark.integration
@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "plain"])
def test_planned_failover_moves_every_connection_to_the_new_primary(
    sentinel_group: SentinelGroup, fast_paths: bool
) -> None:
    """SENTINEL FAILOVER leaves the old primary up and writable until Sentinel reconfigures
    it (about ten seconds later; what was written there is then thrown away). The store's
    connections, a thread's held one included, move to the new primary within a second or
    two of the sentinels naming it."""
    store = Store.from_url(sentinel_group.url, fast_paths=fast_paths)
    try:
        store.redis.set("sentinel:where", "before")
        with sentinel_group.sentinels[0].client() as sentinel:
            assert sentinel.sentinel_failover(MASTER)
        wait_until(
            lambda: sentinel_group.named_primary() == {sentinel_group.replica.port},
            15,
            "every sentinel to name the replica as the primary",
            0.1,
        )
        named_at = time.monotonic()

        def written_on_new_primary() -> bool:
            with contextlib.suppress(StoreUnavailable):  # a cut connection fails once
                store.redis.set("sentinel:where", "after")
            with sentinel_group.replica.client() as promoted:
                return promoted.get("sentinel:where") == b"after"

        wait_until(written_on_new_primary, 5, "a write to reach the new primary", 0.05)
        print(f"\nwrites on the new primary {time.monotonic() - named_at:.2f}s after the switch")
        for n in range(20):  # every later write goes there, none to the old primary
            store.redis.set("sentinel:where", f"final {n}")
        with sentinel_group.replica.client() as promoted:
            assert promoted.get("sentinel:where") == b"final 19"
        with sentinel_group.primary.client() as old:
            assert old.info("replication")["role"] == "master"  # not yet reconfigured
            assert not (old.get("sentinel:where") or b"").startswith(b"final")
    finally:
        store.close()


@pytest.mark.integration
def test_planned_failover_moves_the_async_client_and_its_subscriptions(
    sentinel_group: SentinelGroup,
) -> None:
    """The api's async client (run reads, the run-end subscription) follows a planned
    failover too: a subscriber on the old primary would hear nothing published on the new
    one until Sentinel reconfigured the old primary."""

    async def heard(subscriber: Any) -> bool:
        """Whether the subscriber got "hello"; False after a cut (it resubscribes)."""
        try:
            found = await subscriber.get_message(ignore_subscribe_messages=True, timeout=0.2)
        except redis.ConnectionError:
            await subscriber.aclose()  # as the api's waiter does: subscribe again
            await subscriber.subscribe("sentinel:events")
            return False
        return found is not None and found["data"] == b"hello"

    async def scenario() -> float:
        client = connect_async(sentinel_group.url, socket_timeout=5)
        try:
            async with client.pubsub() as subscriber:
                await subscriber.subscribe("sentinel:events")
                assert (await subscriber.get_message(timeout=2))["type"] == "subscribe"
                # A pooled connection of its own, idle in the pool through the failover.
                await client.set("sentinel:async", "before")
                with sentinel_group.sentinels[0].client() as sentinel:
                    assert sentinel.sentinel_failover(MASTER)
                deadline = time.monotonic() + 15
                while sentinel_group.named_primary() != {sentinel_group.replica.port}:
                    assert time.monotonic() < deadline, "no sentinel named the replica"
                    await asyncio.sleep(0.1)
                named_at = time.monotonic()
                while True:  # the idle connection's writes reach the new primary
                    assert time.monotonic() - named_at < 5, "the async client stayed behind"
                    with contextlib.suppress(StoreUnavailable):
                        await client.set("sentinel:async", "after")
                    with sentinel_group.replica.client() as promoted:
                        if promoted.get("sentinel:async") == b"after":
                            break
                    await asyncio.sleep(0.05)
                moved_s = time.monotonic() - named_at
                while True:  # the subscription hears what the new primary publishes
                    assert time.monotonic() - named_at < 5, "the subscriber stayed behind"
                    with sentinel_group.replica.client() as promoted:
                        promoted.publish("sentinel:events", "hello")
                    if await heard(subscriber):
                        break
            return moved_s
        finally:
            await client.aclose()

    moved_s = asyncio.run(scenario())
    print(f"\nthe async client wrote on the new primary {moved_s:.2f}s after the switch")


@pytest.mark.integration
def test_cli_check_health_and_bad_urls(steady_group: SentinelGroup, tmp_path: Path) -> None:
    """check-health pings the primary through the sentinels; a cluster URL without a broker
    of its own is one line and exit 2 at start, not a traceback."""
    env = {**os.environ, "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}

    def switchboard(url: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "switchboard", *args],
            env={**env, "SWITCHBOARD_REDIS_URL": url, "SWITCHBOARD_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
        )

    healthy = switchboard(steady_group.url, "check-health")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.strip() == "healthy"

    cluster = switchboard("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "api", "--port", "0")
    assert cluster.returncode == 2
    lines = cluster.stderr.strip().splitlines()
    assert len(lines) == 1, cluster.stderr
    assert lines[0].startswith("error: SWITCHBOARD_REDIS_URL is a Redis Cluster, which holds ")
    assert "set SWITCHBOARD_BROKER_URL" in lines[0]

    unknown_master = steady_group.url.replace(f"/{MASTER}/", "/nosuchgroup/")
    down = switchboard(unknown_master, "check-health")
    assert down.returncode == 3
    assert "nosuchgroup" in down.stderr and "Traceback" not in down.stderr


@pytest.mark.integration
def test_up_runs_on_the_sentinel_group_instead_of_embedding_redis(
    steady_group: SentinelGroup, tmp_path: Path
) -> None:
    """`switchboard up` with a sentinel URL starts no redis-server of its own: its api,
    worker and beat use the group, and a run completes through it."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")},
        "SWITCHBOARD_REDIS_URL": steady_group.url,
        "SWITCHBOARD_TOKEN": TOKEN,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "up", "--port", str(port), "--concurrency", "4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, "up exited"
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "up's api to answer /healthz", 0.2)
        run_id = _send(url, "up-sentinel", "through the group")
        wait = {"method": "agent.wait", "params": {"runId": run_id, "timeoutMs": 30_000}}
        resp, _ = _post(url, "/rpc", wait)
        assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text
        health = subprocess.run(
            [sys.executable, "-m", "switchboard", "check-health", "--api", "--worker"],
            cwd=tmp_path,
            env={**env, "SWITCHBOARD_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert health.returncode == 0, health.stderr  # the worker answers over the group
        info = json.loads((tmp_path / ".switchboard" / RUNFILE).read_text())
        assert info["redis_url"] == steady_group.url
        assert not (tmp_path / ".switchboard" / "redis").exists()  # nothing embedded
        with steady_group.primary.client() as primary:
            assert primary.exists(f"sb:r:{run_id}")
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    resp = httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=REQUEST_TIMEOUT_S + 5)
    return resp, time.monotonic() - started


def _send(url: str, session: str, message: str) -> str:
    resp, _ = _post(
        url, "/rpc", {"method": "agent", "params": {"sessionKey": session, "message": message}}
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["runId"])


class _Prober:
    """Sends, lists and health checks in a loop while the sentinels fail over: each answer
    is recorded with its status, Retry-After and how long it took."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[str, int, str | None, float]] = []
        self.acknowledged: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S * 2)

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
                    resp, took = _post(self.url, path, payload)
                except httpx.HTTPError as exc:
                    self.answers.append((name, -1, repr(exc), REQUEST_TIMEOUT_S))
                    continue
                self.answers.append((name, resp.status_code, resp.headers.get("retry-after"), took))
                if name == "agent" and resp.status_code == 200:
                    self.acknowledged.append(str(resp.json()["runId"]))
            time.sleep(0.1)


@pytest.mark.faults
def test_failover_under_load_loses_nothing_and_needs_no_restart(
    sentinel_group: SentinelGroup, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """kill -9 of the primary with runs in flight: the sentinels promote the replica, the
    worker, beat and api follow it by themselves, and every acknowledged run ends ok."""
    cluster = Cluster(sentinel_group.url, tmp_path, base_config(webhook.url))
    try:
        _run_failover(cluster, sentinel_group)
    except BaseException:
        print(cluster.logs(), sentinel_group.logs(), sep="\n")
        raise
    finally:
        cluster.stop_all()
        cluster.services.store.close()


def _run_failover(cluster: Cluster, group: SentinelGroup) -> None:
    worker = cluster.worker(concurrency=16)
    beat = cluster.beat()
    api, url = cluster.api()

    # Broker and state on the sentinel URL: a run completes end to end before the fault.
    first = _send(url, "before-0", "hello")
    resp, _ = _post(
        url, "/rpc", {"method": "agent.wait", "params": {"runId": first, "timeoutMs": 30_000}}
    )
    assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text

    acknowledged = [first]
    for i in range(12):
        for j in range(2):
            acknowledged.append(_send(url, f"load-{i}", f"/sleep 1\nrun {i}.{j}"))
    # Everything acknowledged so far is on the replica before the primary dies: a write
    # then WAIT (loopback replication is sub-millisecond; this makes it certain).
    with group.primary.client() as primary:
        primary.set("sentinel:fence", "1")
        assert primary.wait(1, 2000) == 1
    at_kill = count_by(r.status for r in cluster.runs())
    print(f"\nacknowledged {len(acknowledged)}; at the kill: {at_kill}")

    with _Prober(url) as prober:
        assert group.primary.pid is not None
        os.kill(group.primary.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(
            lambda: group.named_primary() == {group.replica.port},
            30,
            "every sentinel to name the replica as the primary",
            0.2,
        )
        promoted_s = time.monotonic() - killed_at
        # Keep probing until the api answers a send again through the new primary.
        wait_until(lambda: len(prober.acknowledged) >= 3, 30, "sends to succeed again", 0.2)
    during = count_by((a[0], a[1]) for a in prober.answers)
    print(f"promoted after {promoted_s:.1f}s; answers during: {during}")

    assert_failover_lost_nothing(cluster, url, acknowledged, prober)

    # Nobody was restarted: the same processes served before and after.
    assert worker.alive() and beat.alive() and api.alive()
    with redis.Redis(port=group.replica.port) as promoted:
        assert promoted.info("replication")["role"] == "master"


def assert_failover_lost_nothing(
    cluster: Cluster, url: str, acknowledged: list[str], prober: _Prober
) -> None:
    """What a failover under load must leave: answers 200 or 503 with Retry-After within
    the timeout while it ran, new sends complete after it, and every run acknowledged
    (before, during, after) ends ok exactly once with an exact transcript; the 12 load
    sessions hold their two replies in order."""
    bad = [a for a in prober.answers if a[1] not in (200, 503)]
    assert not bad, f"answers other than 200 / 503 while failing over: {bad}"
    no_retry_after = [a for a in prober.answers if a[1] == 503 and not a[2]]
    assert not no_retry_after, f"503 without Retry-After: {no_retry_after}"
    slow = [a for a in prober.answers if a[3] >= REQUEST_TIMEOUT_S]
    assert not slow, f"answers slower than {REQUEST_TIMEOUT_S}s: {slow}"

    # New sends after the failover complete, on the same api and worker.
    after = [_send(url, f"after-{i}", f"after {i}") for i in range(4)]
    for run_id in after:
        resp, _ = _post(
            url, "/rpc", {"method": "agent.wait", "params": {"runId": run_id, "timeoutMs": 30_000}}
        )
        assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text

    everything = acknowledged + prober.acknowledged + after

    def all_ended() -> bool:
        found = cluster.services.store.runs.get_many(everything)
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
