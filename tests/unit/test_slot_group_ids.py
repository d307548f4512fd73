"""Slot groups: where a session, its records and a sub-agent fall, and the groups' tags."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from switchboard.shared import keys as sk
from switchboard.shared.store import slot_groups
from switchboard.shared.store.keyspace import Keyspace

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("groups", [2, 7, 8, 64, 1024])
def test_an_id_made_for_a_group_is_read_back_as_that_group(groups: int) -> None:
    """`new_id` makes a UUID4 whose first 32 bits say its group (any group, any count)."""
    for group in (0, 1, groups // 2, groups - 1):
        made = slot_groups.new_id(group, groups)
        assert len(made) == 36 and made[14] == "4"  # still a version-4 UUID
        assert slot_groups.group_of_id(made, groups) == group
        assert slot_groups.group_of_id(f"wait:{made}", groups) == group  # after a kind:


def test_a_deterministic_id_beside_a_session_is_in_its_group_for_any_count() -> None:
    """`id_beside` keeps the rest of the UUID it is given and takes the session's anchor."""
    base = "12345678-9abc-5def-8123-456789abcdef"
    for key in ("agent:main:main", "agent:ops:relay:group:room-9"):
        placed = slot_groups.id_beside(key, base)
        assert placed[8:] == base[8:]
        for groups in (2, 10, 64, 1000):
            assert slot_groups.group_of_id(placed, groups) == slot_groups.group_of_key(key, groups)


def test_a_sub_agent_is_in_its_requesters_group_however_deep() -> None:
    """A child key ending in an id made beside its requester falls in the requester's
    group, and so does its own child (nested `:subagent:` keys)."""
    ks = Keyspace("sb:", 64)
    requester = "agent:main:telegram:group:42"
    child = sk.subagent_key("main", ks.new_id_beside(requester))
    grandchild = f"{child}:subagent:{ks.new_id_beside(child)}"
    assert ks.group_of_key(child) == ks.group_of_key(requester)
    assert ks.group_of_key(grandchild) == ks.group_of_key(requester)


def test_one_group_keeps_every_key_as_it_was() -> None:
    """With one group nothing is tagged: the keys of a store from before slot groups."""
    ks = Keyspace()
    assert ks.session("agent:main:main") == "sb:s:agent:main:main"
    assert ks.beside("agent:main:x").lane_leases == "sb:idx:leases"
    assert ks.group_of("sb:r:anything") == 0 and ks.layout == "sb:layout"


def test_each_groups_tag_is_in_its_own_share_of_the_slots() -> None:
    """Group g of G has a tag whose slot is in the g-th of G equal slot ranges: distinct
    slots, dealt evenly over primaries that own equal ranges."""
    for groups in (3, 10, 64):
        tags = slot_groups.group_tags(groups)
        slots = [key_slot(tag.encode()) for tag in tags]
        for group, slot in enumerate(slots):
            assert group * 16384 // groups <= slot < (group + 1) * 16384 // groups
            assert slot_groups.group_of_tag(tags[group]) == group


def test_a_key_names_its_group_and_a_foreign_key_none() -> None:
    """`group_of` reads a built key's tag; a key the keyspace did not build is in none."""
    ks = Keyspace("sb:", 64)
    for group in (0, 7, 63):
        assert ks.group_of(ks.at(group).events) == group
    assert ks.group_of(ks.run(ks.new_id(9))) == 9
    assert ks.group_of("sb:{x}:events") == -1 and ks.group_of("test-link-hash") == -1
    assert ks.layout == "sb:layout"  # the record is in no group


def test_a_prefix_with_a_tag_of_its_own_cannot_be_cut_into_groups() -> None:
    """Several groups each bring their tag: a prefix holding one is refused."""
    with pytest.raises(ValueError, match="hash tag"):
        Keyspace("{app}:", 8)
    assert Keyspace("{app}:", 1).session("k") == "{app}:s:k"
