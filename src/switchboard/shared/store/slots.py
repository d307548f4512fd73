"""Which keys a Redis command names, and in which hash slot they are.

Read by the slot check (`check_one_slot`: a script or transaction must name keys of one
slot, as a Redis Cluster demands) and by the cluster router (`routing_key`: the key whose
slot's primary a command is sent to). A key's slot is Redis Cluster's: CRC16 of the key,
or of its ``{hash tag}``, modulo 16384 (`key_slot`).
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot as _crc_slot


class CrossSlotError(RuntimeError):
    """A script or transaction named keys of more than one hash slot: a bug in the store
    (a Redis Cluster refuses it with CROSSSLOT), found on any Redis with the slot check on
    (``SWITCHBOARD_SLOT_CHECK``) and always by the cluster router's transactions. Not a
    `StoreUnavailable`: nothing retries it."""


# Commands whose every argument after the name is a key; any other keyed command's key is
# its first argument, and a script's keys are counted by its third.
_ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "TOUCH"})
SCRIPT_COMMANDS = frozenset({"EVALSHA", "EVAL"})
# Stream reads name their streams after the word STREAMS.
_STREAM_READS = frozenset({"XREAD", "XREADGROUP"})
# Commands that name no key although they take arguments: the router sends them to a
# primary of its choosing.
_KEYLESS = frozenset(
    {
        *("CLIENT", "CLUSTER", "COMMAND", "CONFIG", "DBSIZE", "ECHO", "FLUSHALL", "FLUSHDB"),
        *("KEYS", "RANDOMKEY", "ROLE", "SCAN", "TIME"),
    }
)


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


def routing_key(args: tuple[Any, ...]) -> Any | None:
    """The key whose slot a command goes to on a cluster: a script's first key, a stream
    read's first stream, else the first key `command_keys` reads; None for a command that
    names none (PING, INFO, PUBLISH, WAIT, SCRIPT, SCAN, …)."""
    name = str(args[0]).upper()
    if name in _STREAM_READS:
        words = [_text(arg).upper() for arg in args]
        at = words.index("STREAMS") + 1 if "STREAMS" in words else len(args)
        return args[at] if at < len(args) else None
    if name in _KEYLESS:
        return None
    keys = command_keys(args)
    return keys[0] if keys else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
