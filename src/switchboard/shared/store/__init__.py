"""Redis model: sessions, transcripts, runs and session lanes, behind one facade.

The store is the only part of the product that talks to Redis. Its client (`client`)
raises `StoreUnavailable` for any Redis failure, so callers handle one error of ours.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared import keys as sk
from switchboard.shared.store.a2a_tasks import A2ATaskStore
from switchboard.shared.store.audit import AuditStore
from switchboard.shared.store.batches import BatchStore
from switchboard.shared.store.client import connect
from switchboard.shared.store.collect import CollectStore
from switchboard.shared.store.deliveries import DeliveryStore
from switchboard.shared.store.durability import NO_WAIT, Durability
from switchboard.shared.store.events import EventStore
from switchboard.shared.store.files import FileStore
from switchboard.shared.store.flows import FlowStore
from switchboard.shared.store.gauges import GaugeStore, ListLengths
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.pending import PendingStepStore
from switchboard.shared.store.responses import ResponseStore
from switchboard.shared.store.runs import RunStore
from switchboard.shared.store.sessions import SessionStore
from switchboard.shared.store.spawns import SpawnStore
from switchboard.shared.store.stats import ProgressReads, ServerStats
from switchboard.shared.store.steering import SteerStore
from switchboard.shared.store.sweeps import SweepStore
from switchboard.shared.store.tokens import TokenStore
from switchboard.shared.store.tool_slots import ToolSlotStore
from switchboard.shared.store.transcripts import TranscriptStore
from switchboard.shared.store.windows import TranscriptWindows
from switchboard.shared.store.yields import YieldStore

__all__ = [
    "AuditStore",
    "BatchStore",
    "CollectStore",
    "DeliveryStore",
    "EventStore",
    "FileStore",
    "FlowStore",
    "GaugeStore",
    "Keyspace",
    "PendingStepStore",
    "Pipeline",
    "ResponseStore",
    "RunStore",
    "SessionStore",
    "SpawnStore",
    "Store",
    "SweepStore",
    "TokenStore",
    "ToolSlotStore",
    "TranscriptStore",
    "TranscriptWindows",
    "YieldStore",
]


class Store:
    """Everything the domain keeps in Redis, sharing one client and one key prefix."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "sb:",
        groups: int = 1,
        main_key: str = "main",
        scope: str = "per-sender",
        retention_s: int = 24 * 3600,
        max_attempts: int = 3,
        lease_s: int = 30,
        windows: TranscriptWindows | None = None,
        publish_ends_after_wait: bool = False,
        batch_retention_s: int = 30 * 24 * 3600,
    ) -> None:
        self.redis = redis
        self.ks = Keyspace(prefix, groups)
        kind_of = partial(sk.session_kind, main_key=main_key, scope=scope)
        self.sessions = SessionStore(redis, self.ks, kind_of)
        self.transcripts = TranscriptStore(redis, self.ks)
        self.runs = RunStore(
            redis,
            self.ks,
            retention_s=retention_s,
            max_attempts=max_attempts,
            kind_of=kind_of,
            lease_s=lease_s,
            windows=windows,  # recent history kept here: claims read only what is newer
            publish_ends_after_wait=publish_ends_after_wait,
        )
        self.events = EventStore(redis, self.ks)
        self.flows = FlowStore(redis, self.ks)  # reply-back flows (sessions_send)
        self.spawns = SpawnStore(redis, self.ks, retention_s=retention_s)  # sub-agents, batches
        self.yields = YieldStore(redis, self.ks, retention_s=retention_s)  # sessions_yield
        self.steering = SteerStore(redis, self.ks)  # sessions_send steer and notify
        # collector children, their completion logs and agents_wait's tokens
        self.collect = CollectStore(redis, self.ks, retention_s=retention_s)
        self.deliveries = DeliveryStore(redis, self.ks)
        self.pending = PendingStepStore(redis, self.ks)  # flow steps enqueued, not yet run
        self.gauges = GaugeStore(redis, self.ks)
        self.responses = ResponseStore(redis, self.ks)  # OpenAI Responses API ids
        self.a2a_tasks = A2ATaskStore(redis, self.ks, retention_s=retention_s)  # A2A tasks
        self.sweeps = SweepStore(redis, self.ks)  # the beat sweep's marks and stale entries
        self.tokens = TokenStore(redis, self.ks)  # scoped api tokens (hashes only)
        self.audit = AuditStore(redis, self.ks)  # calls made with scoped tokens
        self.tool_slots = ToolSlotStore(redis, self.ks)  # tool servers' maxConcurrent slots
        # the Files and Batches API: files with their lines, batches with their admission
        self.files = FileStore(redis, self.ks, ttl_s=batch_retention_s)
        self.batches = BatchStore(redis, self.ks, ttl_s=batch_retention_s)
        self.list_lengths = ListLengths(redis)  # the broker's queues, when it shares the Redis
        self.stats = ServerStats(redis)  # INFO: calls per command, memory, version
        self.progress = ProgressReads(redis, self.ks)  # how far a burst of work has got

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        durability: Durability = NO_WAIT,
        slot_check: bool = False,
        **options: Any,
    ) -> Store:
        """A store on a new client for ``url`` (`client.connect`; ``options`` as for
        `Store`), its runs' history read incrementally (`TranscriptWindows`);
        acknowledged writes waited for on replicas as ``durability`` says; with
        ``slot_check`` a script or transaction whose keys span hash slots is refused on any
        Redis (`client.CrossSlotError`)."""
        windows = TranscriptWindows()
        client = connect(url, durability=durability, slot_check=slot_check)
        after_wait = durability.replicas > 0  # a run's end told once replicas have it
        return cls(client, windows=windows, publish_ends_after_wait=after_wait, **options)

    def pipeline(self) -> Pipeline:
        """A pipeline (no transaction) the stores' ``client=`` methods queue on: one
        ``execute`` sends a step's writes across stores in one round trip."""
        return self.redis.pipeline(transaction=False)

    def layout_groups(self, *, record: bool = True) -> int:
        """The slot groups the store's data is cut into, as recorded by the first process
        that asked (this one's `Keyspace.groups` when none had, or 1 when the store holds
        data of one group made before the record: a cluster's one-slot store upgraded):
        a process cut otherwise would not find what the others write. With ``record``
        False nothing is written (what would be recorded is answered)."""
        layout = self.ks.layout
        recorded = self.redis.hget(layout, "groups")
        if recorded is not None:
            return int(recorded)
        pipe = self.redis.pipeline(transaction=False)  # the first process, or data from
        for index in self.ks.one_group_indexes:  # before the record
            pipe.exists(index)
        groups = 1 if any(pipe.execute()) else self.ks.groups
        if not record:
            return groups
        self.redis.hsetnx(layout, "groups", groups)
        return int(self.redis.hget(layout, "groups") or groups)

    def ping(self) -> bool:
        """Whether Redis answers (raises `StoreUnavailable` when it does not)."""
        return bool(self.redis.ping())

    def close(self) -> None:
        """Close the client's connections."""
        self.redis.close()
