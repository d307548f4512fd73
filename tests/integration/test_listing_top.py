"""A listing's merged first rows over many indexes (one per slot group) are read by share,
then only where more may be: the same rows, in the same order, as reading every index
whole and merging them."""

from __future__ import annotations

import heapq
import random

import pytest
import redis

from switchboard.shared.store import Store
from switchboard.shared.store.codec import as_text

pytestmark = pytest.mark.integration


def _whole(client: redis.Redis, indexes: list[str], hi: str, lo: str) -> list[tuple[str, int]]:
    rows = [
        [(as_text(m), int(s)) for m, s in client.zrevrangebyscore(i, hi, lo, withscores=True)]
        for i in indexes
    ]
    return list(heapq.merge(*rows, key=lambda pair: -pair[1]))


@pytest.mark.parametrize("spread", ["even", "one-hot", "ties"])
def test_reading_by_share_answers_what_reading_everything_does(
    redis_client: redis.Redis, spread: str
) -> None:
    """64 indexes, uneven or tied scores: every `want`, with and without score bounds."""
    store = Store(redis_client, prefix="t:", groups=64)
    rng = random.Random(spread)
    indexes = [group.updated_all for group in store.ks.every_group()]
    pipe = redis_client.pipeline(transaction=False)
    for n, index in enumerate(indexes):
        count = {"even": 30, "one-hot": 400 if n == 5 else 3, "ties": 25}[spread]
        members = {}
        for i in range(count):
            score = rng.randrange(50) if spread == "ties" else rng.randrange(1_000_000)
            if spread == "one-hot" and n == 5:
                score += 1_000_000  # one index holds the newest of all
            members[f"k{n}-{i}"] = score
        pipe.zadd(index, members)
    pipe.execute()
    sessions = store.sessions
    for hi, lo in (("+inf", "-inf"), ("+inf", "40"), ("1000020", "-inf")):
        expected = _whole(redis_client, indexes, hi, lo)
        for want in (1, 3, 10, 50, 200, 5000):
            assert sessions._top(indexes, hi, lo, want) == expected[:want], (hi, lo, want)
