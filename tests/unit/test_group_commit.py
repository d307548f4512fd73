"""GroupCommit batches the items added during a publish, and CeleryQueue sends runs through it."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from switchboard.workers import queue as queue_module
from switchboard.workers.queue import RUNS_PER_MESSAGE, CeleryQueue, GroupCommit
from switchboard.workers.routing import RUNS_QUEUE

pytestmark = pytest.mark.unit

WAIT_S = 5.0


class Boom(Exception):
    """What the fake publish raises."""


class Recorder:
    """A fake publish: records each batch, can hold chosen batches, and can raise."""

    def __init__(self, hold: set[int] | None = None, fail: set[int] | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.finished: set[Any] = set()  # items whose publish has returned
        self.started = [threading.Event() for _ in range(4)]  # batch n entered publish
        self.release = [threading.Event() for _ in range(4)]  # batch n may finish
        self.hold = hold or set()
        self.fail = fail or set()
        self.errors: dict[int, Boom] = {}
        self._lock = threading.Lock()

    def __call__(self, items: list[Any]) -> None:
        with self._lock:
            n = len(self.batches)
            self.batches.append(list(items))
        if n < len(self.started):
            self.started[n].set()
        if n in self.hold:
            assert self.release[n].wait(WAIT_S), f"batch {n} was never released"
        with self._lock:
            self.finished.update(items)
        if n in self.fail:
            self.errors[n] = Boom(f"batch {n}")
            raise self.errors[n]


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Poll `predicate` until true (a condition, not a fixed sleep), failing after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


class Adder(threading.Thread):
    """A thread that adds one item and records how it went."""

    def __init__(self, commit: GroupCommit[Any], item: Any, publish: Recorder) -> None:
        super().__init__(daemon=True)
        self.commit, self.item, self.publish = commit, item, publish
        self.returned = threading.Event()
        self.error: BaseException | None = None
        self.published_on_return = False

    def run(self) -> None:
        try:
            self.commit.add(self.item)
        except BaseException as exc:
            self.error = exc
        self.published_on_return = self.item in self.publish.finished
        self.returned.set()


def add_within_wait(commit: GroupCommit[Any], item: Any, publish: Recorder) -> Adder:
    """Add `item` from a thread, failing (not hanging) if the add does not return in time."""
    adder = Adder(commit, item, publish)
    adder.start()
    assert adder.returned.wait(WAIT_S), f"add({item!r}) did not return"
    return adder


def hold_first_batch(publish: Recorder, n_adders: int) -> tuple[GroupCommit[Any], list[Adder]]:
    """Start a publish of "first" held in `publish`, then `n_adders` adds queued behind it."""
    commit: GroupCommit[Any] = GroupCommit(publish)
    first = Adder(commit, "first", publish)
    first.start()
    assert publish.started[0].wait(WAIT_S)
    adders = [Adder(commit, f"item-{i}", publish) for i in range(n_adders)]
    for adder in adders:
        adder.start()
    # All adds have queued their item behind the held publish before it is let go.
    wait_for(lambda: len(commit._open.items) == n_adders, "every add to queue its item")
    return commit, [first, *adders]


def test_a_lone_add_publishes_its_item_alone_before_returning() -> None:
    """An add to an idle GroupCommit publishes a batch of just its item, in the caller."""
    threads: list[threading.Thread] = []
    publish = Recorder()

    def record_thread(items: list[Any]) -> None:
        threads.append(threading.current_thread())
        publish(items)

    commit: GroupCommit[str] = GroupCommit(record_thread)
    commit.add("a")
    assert publish.batches == [["a"]]
    assert threads == [threading.current_thread()]
    commit.add("b")
    assert publish.batches == [["a"], ["b"]]


def test_adds_during_a_publish_go_out_together_in_the_next_one() -> None:
    """Items added from other threads while a publish is held make exactly one next batch,
    and none of those adds returns before that batch is published."""
    publish = Recorder(hold={0, 1})
    _, (first, *adders) = hold_first_batch(publish, n_adders=8)
    assert not any(a.returned.is_set() for a in [first, *adders])

    publish.release[0].set()
    assert publish.started[1].wait(WAIT_S)
    assert first.returned.wait(WAIT_S)
    # The second batch is being published: none of its adders may have returned.
    assert not any(a.returned.is_set() for a in adders)

    publish.release[1].set()
    for adder in adders:
        assert adder.returned.wait(WAIT_S)
    assert len(publish.batches) == 2
    assert publish.batches[0] == ["first"]
    assert sorted(publish.batches[1]) == sorted(a.item for a in adders)
    assert all(a.published_on_return and a.error is None for a in [first, *adders])


def test_a_failed_publish_raises_in_every_adder_of_its_batch_and_the_next_add_works() -> None:
    """The exception publish raised is re-raised by each add in that batch (only), and the
    GroupCommit publishes again afterwards."""
    publish = Recorder(hold={0}, fail={1})
    commit, (first, *adders) = hold_first_batch(publish, n_adders=5)

    publish.release[0].set()
    for adder in [first, *adders]:
        assert adder.returned.wait(WAIT_S)
    assert first.error is None
    assert all(a.error is publish.errors[1] for a in adders)

    assert add_within_wait(commit, "later", publish).error is None
    assert publish.batches[-1] == ["later"]
    assert len(publish.batches) == 3


def test_a_lone_add_raises_what_its_publish_raised() -> None:
    """With no company, the adder gets its own publish's exception, then publishing goes on."""
    publish = Recorder(fail={0})
    commit: GroupCommit[str] = GroupCommit(publish)
    with pytest.raises(Boom) as raised:
        commit.add("a")
    assert raised.value is publish.errors[0]
    assert add_within_wait(commit, "b", publish).error is None
    assert publish.batches == [["a"], ["b"]]


def test_every_item_is_published_once_under_concurrent_adds() -> None:
    """16 threads x 200 adds: each item goes out exactly once, publishes never overlap, and
    every add returns after its item was published."""
    published: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    in_publish = 0
    overlaps = 0
    lock = threading.Lock()

    def publish(items: list[tuple[int, int]]) -> None:
        nonlocal in_publish, overlaps
        with lock:
            in_publish += 1
            overlaps += in_publish > 1
        if random.random() < 0.3:
            time.sleep(0.0002)  # lets adds pile up behind a publish
        with lock:
            published.extend(items)
            seen.update(items)
            in_publish -= 1

    commit: GroupCommit[tuple[int, int]] = GroupCommit(publish)
    start = threading.Barrier(16)
    late: list[tuple[int, int]] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        start.wait()
        for i in range(200):
            if rng.random() < 0.2:
                time.sleep(rng.random() * 0.0002)
            commit.add((t, i))
            with lock:
                if (t, i) not in seen:
                    late.append((t, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
        assert not thread.is_alive()

    assert Counter(published) == Counter((t, i) for t in range(16) for i in range(200))
    assert overlaps == 0
    assert late == []


def test_a_publish_right_after_one_with_company_waits_for_more() -> None:
    """Under load (the last publish just ended, and it carried several items) a publish
    lingers, and the adds made meanwhile go out with it in one batch; each add returns once
    its item is published."""
    publish = Recorder(hold={0})
    commit: GroupCommit[str] = GroupCommit(publish, linger_s=1.0, busy_within_s=30.0)
    first = Adder(commit, "a", publish)
    first.start()  # a quiet publisher: out at once, alone (held, so company gathers)
    assert publish.started[0].wait(WAIT_S)
    company = [Adder(commit, item, publish) for item in ("b", "c")]
    for adder in company:
        adder.start()
    wait_for(lambda: len(commit._open.items) == 2, "both adds to queue behind the publish")
    publish.release[0].set()
    for adder in [first, *company]:
        assert adder.returned.wait(WAIT_S) and adder.error is None
    assert publish.batches == [["a"], ["b", "c"]]  # the second had company: under load
    lingering = Adder(commit, "d", publish)
    lingering.start()
    wait_for(lambda: commit._busy, "the next publish to start lingering")
    joiners = [Adder(commit, item, publish) for item in ("e", "f")]
    for joiner in joiners:
        joiner.start()
    for adder in [lingering, *joiners]:
        assert adder.returned.wait(WAIT_S)
        assert adder.published_on_return and adder.error is None
    assert publish.batches == [["a"], ["b", "c"], ["d", "e", "f"]]


def test_a_caller_that_sends_one_at_a_time_never_lingers() -> None:
    """A send-and-wait loop publishes one item at a time, each right after the last: with
    no company in sight it never lingers (a linger here would hold each add for half a
    minute)."""
    publish = Recorder()
    commit: GroupCommit[str] = GroupCommit(publish, linger_s=30.0, busy_within_s=30.0)
    started = time.monotonic()
    for item in ("a", "b", "c", "d"):
        assert add_within_wait(commit, item, publish).error is None
    assert time.monotonic() - started < WAIT_S
    assert publish.batches == [["a"], ["b"], ["c"], ["d"]]


def test_a_quiet_publisher_never_lingers() -> None:
    """Once the last publish is longer ago than `busy_within_s`, an add goes out at once
    (a linger here would hold it for half a minute)."""
    publish = Recorder()
    commit: GroupCommit[str] = GroupCommit(publish, linger_s=30.0, busy_within_s=0.05)
    commit.add("a")
    time.sleep(0.1)
    started = time.monotonic()
    assert add_within_wait(commit, "b", publish).error is None
    assert time.monotonic() - started < WAIT_S
    assert publish.batches == [["a"], ["b"]]


# --- CeleryQueue: one run as `switchboard.run`, several as `switchboard.runs` -------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CeleryQueue, list[dict[str, Any]]]]:
    """A CeleryQueue on an in-memory Celery app whose `send_task` calls are recorded."""
    app = Celery("test", broker="memory://")
    calls: list[dict[str, Any]] = []

    def send_task(name: str, **kwargs: Any) -> None:
        calls.append({"name": name, **kwargs})

    monkeypatch.setattr(app, "send_task", send_task)
    yield CeleryQueue(app), calls
    app.close()


def pairs(n: int) -> list[tuple[str, str]]:
    """`n` (run id, session key) pairs."""
    return [(f"run-{i}", f"agent:a:s-{i}") for i in range(n)]


def test_publishing_one_run_sends_switchboard_run(
    sent: tuple[CeleryQueue, list[dict[str, Any]]],
) -> None:
    """A batch of one run is sent as the single-run task with [run id, session key]."""
    queue, calls = sent
    queue._publish_runs(pairs(1))
    assert [(c["name"], c["args"], c["queue"]) for c in calls] == [
        ("switchboard.run", ["run-0", "agent:a:s-0"], RUNS_QUEUE)
    ]


def test_a_lone_enqueue_run_sends_switchboard_run(
    sent: tuple[CeleryQueue, list[dict[str, Any]]],
) -> None:
    """enqueue_run with nothing else in flight sends one `switchboard.run` before returning."""
    queue, calls = sent
    queue.enqueue_run("run-x", "agent:a:x")
    assert [(c["name"], c["args"]) for c in calls] == [("switchboard.run", ["run-x", "agent:a:x"])]


def test_publishing_several_runs_sends_switchboard_runs_messages(
    sent: tuple[CeleryQueue, list[dict[str, Any]]],
) -> None:
    """A batch of several runs goes as `switchboard.runs` messages of up to RUNS_PER_MESSAGE
    pairs over one producer, a leftover single pair as `switchboard.run`."""
    queue, calls = sent
    runs = pairs(2 * RUNS_PER_MESSAGE + 1)
    queue._publish_runs(runs)
    as_lists = [[r, k] for r, k in runs]
    assert [(c["name"], c["args"], c["queue"]) for c in calls] == [
        ("switchboard.runs", [as_lists[:RUNS_PER_MESSAGE]], RUNS_QUEUE),
        ("switchboard.runs", [as_lists[RUNS_PER_MESSAGE : 2 * RUNS_PER_MESSAGE]], RUNS_QUEUE),
        ("switchboard.run", as_lists[-1], RUNS_QUEUE),
    ]
    producers = {id(c["producer"]) for c in calls}
    assert len(producers) == 1 and calls[0]["producer"] is not None

    calls.clear()
    queue._publish_runs(pairs(3))
    assert [(c["name"], c["args"]) for c in calls] == [
        ("switchboard.runs", [[[r, k] for r, k in pairs(3)]])
    ]


def test_runs_enqueued_back_to_back_share_a_message(
    monkeypatch: pytest.MonkeyPatch, sent: tuple[CeleryQueue, list[dict[str, Any]]]
) -> None:
    """CeleryQueue lingers under load as configured: runs enqueued right after a publish
    that carried several go out as one `switchboard.runs` message (the linger stretched
    here so threads make it in time, and the window that counts as under load too: threads
    started on a loaded machine may come more than the 4 ms after the last publish)."""
    monkeypatch.setattr(queue_module, "RUNS_LINGER_S", 2.0)
    monkeypatch.setattr(queue_module, "RUNS_BUSY_WITHIN_S", 5.0)
    _, calls = sent
    queue = CeleryQueue(sent[0].app)
    group_commit = queue.group_commit
    record = queue.app.send_task
    first_sent, go_on = threading.Event(), threading.Event()

    def send_task(name: str, **kwargs: Any) -> None:  # the first publish held till told
        record(name, **kwargs)
        if not first_sent.is_set():
            first_sent.set()
            assert go_on.wait(WAIT_S)

    monkeypatch.setattr(queue.app, "send_task", send_task)

    def enqueue(*runs: int) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=queue.enqueue_run, args=(f"run-{i}", f"agent:a:s-{i}"))
            for i in runs
        ]
        for thread in threads:
            thread.start()
        return threads

    # Runs that arrive while a publish is under way make the next one, with company.
    (alone,) = enqueue(0)
    assert first_sent.wait(WAIT_S)
    pair = enqueue(1, 2)
    wait_for(lambda: len(group_commit._open.items) == 2, "both runs to queue behind it")
    go_on.set()
    for thread in [alone, *pair]:
        thread.join(WAIT_S)
    # Runs enqueued right after that go out together, the first lingering for the others.
    for thread in enqueue(3, 4, 5):
        thread.join(WAIT_S + 2.0)
    assert [c["name"] for c in calls] == ["switchboard.run", "switchboard.runs", "switchboard.runs"]
    assert sorted(r for r, _ in calls[1]["args"][0]) == ["run-1", "run-2"]
    assert sorted(r for r, _ in calls[2]["args"][0]) == ["run-3", "run-4", "run-5"]


def test_a_redis_broker_skips_the_declare(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CeleryQueue on the product's app with a Redis broker skips declaring the queue
    before each publish (a list LPUSH makes)."""
    from switchboard.shared.config import Settings
    from switchboard.workers.app import create_celery_app

    app = create_celery_app(Settings(redis_url="redis://127.0.0.1:1/0"))
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kwargs: calls.append(kwargs))
    try:
        queue = CeleryQueue(app)
        queue.enqueue_run("run-0", "agent:a:s-0")
        queue.enqueue_runs(pairs(3))
        queue.enqueue("switchboard.flows.step", "flow-1")
        assert [c["declare"] for c in calls] == [[]] * 3
    finally:
        app.close()


def test_a_rabbitmq_broker_keeps_the_declare() -> None:
    """RabbitMQ drops a message sent to a queue nobody declared: there every publish still
    declares its queue."""
    from switchboard.shared.config import Settings
    from switchboard.workers.app import create_celery_app

    settings = Settings(
        redis_url="redis://127.0.0.1:1/0",
        broker_url="amqp://guest@127.0.0.1:1//",
    )
    app = create_celery_app(settings)
    try:
        assert app.conf.switchboard_declare_on_publish
        assert CeleryQueue(app)._declare is None
    finally:
        app.close()
