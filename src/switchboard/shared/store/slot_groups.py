"""Slot groups: which part of the keyspace a session, or a record named by an id, lives in.

On a Redis Cluster a Lua script or a transaction may touch keys of one hash slot only.
The store's keys are cut into ``groups`` slot groups (``SWITCHBOARD_SLOT_GROUPS``), each
under a hash tag of its own (``sb:{7.38}:…``, `group_tags`), so a cluster spreads them over
its shards while every key one step touches shares a slot:

- a session's keys (its hash, transcript, lane, indexes of its own) are in the group of
  its key: its `anchor` (the CRC-32 of the key) modulo ``groups``;
- a record created for a session (a run, a flow, a spawn, a delivery, a wait token) is
  named by an id this module makes *for* that group: a UUID whose first 32 bits are
  congruent to the group modulo ``groups`` (`new_id`; a deterministic id takes the
  session's anchor as its first 32 bits: `id_beside`), so the id alone says where the
  record is (`group_of_id`), and a reader needs nothing else;
- a spawned sub-agent's key ends in such an id made for its requester's group
  (`subagent:<uuid>`), so a parent and its children share a group: a spawn, its
  announce, a fork of the parent's transcript and a ``sessions_yield`` each stay one
  step on one slot.

Each group's hash tag is chosen so that its slot falls in the group's own share of the
16,384 slots (`group_tags`: group g of 64 in slots 256g to 256g + 255): a cluster whose
primaries own equal slot ranges, as ``redis-cli --cluster create`` deals them, holds as
many groups on each primary as whole groups allow (64 over 10 primaries: 6 or 7 each),
where the plain numbers' slots would fall unevenly (5 to 9).

With one group (the default on one Redis or a Sentinel group) every id is a plain UUID4,
every key is in group 0 and nothing here costs anything.
"""

from __future__ import annotations

import functools
import secrets
import uuid
import zlib

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

# The bits of an id that carry its group: the first 8 hex digits of the UUID.
_HEAD_HEX = 8
_HEAD_SPAN = 1 << (4 * _HEAD_HEX)
_HEX = frozenset("0123456789abcdefABCDEF")
# A sub-agent key ends in `subagent:<id>`; its group is the id's.
_SUBAGENT = ":subagent:"


@functools.cache
def group_tags(groups: int) -> tuple[str, ...]:
    """The hash tag of each of ``groups`` groups: ``"<g>"`` or ``"<g>.<n>"``, the first
    whose slot is in group g's equal share of the slots (``key_slot`` of a tag is that of
    every key carrying it)."""
    tags = []
    for group in range(groups):
        low = group * REDIS_CLUSTER_HASH_SLOTS // groups
        high = (group + 1) * REDIS_CLUSTER_HASH_SLOTS // groups
        tag, n = str(group), 0
        while not low <= key_slot(tag.encode()) < high:
            n += 1
            tag = f"{group}.{n}"
        tags.append(tag)
    return tuple(tags)


def group_of_tag(tag: str) -> int:
    """The group a `group_tags` tag names."""
    return int(tag.partition(".")[0])


def new_id(group: int, groups: int) -> str:
    """A random UUID4 string whose group (`group_of_id`) is ``group`` of ``groups``."""
    raw = secrets.token_bytes(16)
    if groups > 1:
        head = int.from_bytes(raw[:4], "big")
        head = head - head % groups + group
        if head >= _HEAD_SPAN:
            head -= groups
        raw = head.to_bytes(4, "big") + raw[4:]
    return str(uuid.UUID(bytes=raw, version=4))


def group_of_id(some_id: str, groups: int) -> int:
    """The group of a record named by ``some_id`` (a `new_id` or `id_beside`, possibly
    after a ``kind:`` prefix); an id made elsewhere falls in the group of its CRC-32."""
    if groups == 1:
        return 0
    return _head(some_id.rpartition(":")[2], some_id) % groups


def group_of_key(session_key: str, groups: int) -> int:
    """The group of a session: its `anchor` modulo ``groups``."""
    return 0 if groups == 1 else anchor(session_key) % groups


def anchor(session_key: str) -> int:
    """A session's 32-bit anchor, whose residue modulo any number of groups is its group
    there: the head of its sub-agent id for ``…:subagent:<id>`` keys (the requester's
    group, see the module), else the CRC-32 of the key."""
    _, marker, tail = session_key.rpartition(_SUBAGENT)
    if marker:
        return _head(tail, session_key)
    return zlib.crc32(session_key.encode())


def id_beside(session_key: str, some_uuid: str) -> str:
    """``some_uuid`` (a UUID string, e.g. a deterministic UUID5) with its first 32 bits
    replaced by the session's `anchor`: an id of the session's group whatever the number
    of groups, derived from ``some_uuid`` alone."""
    return f"{anchor(session_key):08x}{some_uuid[_HEAD_HEX:]}"


def _head(text: str, whole: str) -> int:
    """The first 32 bits of an id (``text``), or the CRC-32 of ``whole`` when ``text``
    does not start with 8 hex digits."""
    head = text[:_HEAD_HEX]
    if len(head) == _HEAD_HEX and _HEX.issuperset(head):
        return int(head, 16)
    return zlib.crc32(whole.encode())
