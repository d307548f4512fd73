"""The transcript search store on a real Redis Cluster: sessions of many slot groups are
scanned by one script per group (their keys share its slot), in one pipelined round trip,
and the best candidates are read back whole."""

from __future__ import annotations

import pytest

from switchboard.shared.store import Store
from switchboard.shared.store.client import connect
from switchboard_testkit.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.integration


def test_scan_and_read_span_every_slot_group(steady_cluster: RedisClusterGroup) -> None:
    """Forty sessions over sixteen groups: every one holding the word is a candidate, with
    its weight (a phrase hit weighs 1000 more), and each candidate reads back its message."""
    client = connect(steady_cluster.url)
    try:
        store = Store(client, prefix="search-x:", groups=16)
        keys = [f"agent:main:s{n}" for n in range(40)]
        assert len({store.ks.group_of_key(k) for k in keys}) > 8
        for n, key in enumerate(keys):
            store.sessions.ensure(key, on_create={})
            text = "the Quick brown fox" if n % 2 else "a quick note"
            store.transcripts.append(key, {"role": "user", "content": text}, 1)
            store.transcripts.append(key, {"role": "user", "content": "unrelated"}, 2)
        found = store.search.scan(keys, ["quick", "fox"], "quick brown fox", 10)
        assert [c.session_key for c in found] == keys
        assert {c.seq for c in found} == {1}
        weights = {c.session_key: c.weight for c in found}
        assert weights["agent:main:s1"] == 1002 and weights["agent:main:s0"] == 1
        read = store.search.read(found)
        assert [c.message["content"] for c in read[:2]] == ["a quick note", "the Quick brown fox"]
    finally:
        client.close()
