"""Which keys a Redis command names, and in which hash slot they are.

Read by the slot check (`check_one_slot`: a script or transaction must name keys of one
slot, as a Redis Cluster demands). A key's slot is Redis Cluster's: CRC16 of the key, or
of its ``{hash tag}``, modulo 16384 (`key_slot`).
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot as _crc_slot


class CrossSlotError(RuntimeError):
    """A script or transaction named keys of more than one hash slot: a bug in the store
    (a Redis Cluster refuses it with CROSSSLOT), found on any Redis with the slot check on
    (``SWITCHBOARD_SLOT_CHECK``) and always by the cluster client. Not a
    `StoreUnavailable`: nothing retries it."""


# Commands whose every argument after the name is a key; any other keyed command's key is
# its first argument, and a script's keys are counted by its third.
_ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "TOUCH"})
SCRIPT_COMMANDS = frozenset({"EVALSHA", "EVAL"})


def key_slot(key: Any) -> int:
    """The hash slot of ``key`` (text or bytes) on a Redis Cluster."""
    return _crc_slot(key if isinstance(key, bytes) else str(key).encode())


def command_keys(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The keys a command names, as the slot check reads them (none for a command that
    names none the check cares about: PUBLISH's channel, WAIT)."""
    name = str(args[0]).upper()
    if name in SCRIPT_COMMANDS:
        return args[3 : 3 + int(args[2])]
    if name in _ALL_KEYS:
        return args[1:]
    if name in ("PUBLISH", "WAIT", "MULTI", "EXEC", "PING", "INFO", "SCRIPT") or len(args) < 2:
        return ()
    return args[1:2]


def check_one_slot(what: str, keys: Any) -> None:
    """Raise `CrossSlotError` unless every key in ``keys`` is in one hash slot."""
    by_slot: dict[int, list[str]] = {}
    for k in keys:
        by_slot.setdefault(key_slot(k), []).append(_text(k))
    if len(by_slot) > 1:
        # The slots with fewest keys first: usually the key that strayed.
        ranked = sorted(by_slot.items(), key=lambda item: len(item[1]))
        shown = "; ".join(f"slot {slot}: {', '.join(names[:3])}" for slot, names in ranked)
        raise CrossSlotError(f"{what} spans {len(by_slot)} hash slots: {shown}")


def check_script(args: tuple[Any, ...]) -> None:
    """Raise `CrossSlotError` when the command ``args`` is a script whose keys span slots."""
    if str(args[0]).upper() in SCRIPT_COMMANDS:
        check_one_slot(f"script {args[1]}", command_keys(args))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
