"""A run's intake of steered messages (``sessions_send`` with ``mode: "steer"``).

The model loop asks for them after each step that called tools, before its next model
request (`Steering.take`: one LRANGE of the session's steer inbox), and before its first
request when the run starts with some known to wait: its claim or resume read the session's
``steerQueued``, or its end step handed them back (`Steering.carried`). They join the next
request as user messages. The run counts what it took (``taken``): its park or end step
removes that many from the inbox with its messages (store/steering.py), so a run whose
worker dies first takes them again on its next attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelRequest, ModelRequestPart, UserPromptPart

from switchboard.shared.runtime.transcript import to_model_messages
from switchboard.shared.store.steering import SteerStore


@dataclass
class Steering:
    """One run's steered messages: how many it took from its session's inbox, and those
    handed to it to take first (``carried``)."""

    store: SteerStore
    session_key: str
    look_first: bool = False  # the session had steered messages waiting at the claim
    carried: list[dict[str, Any]] = field(default_factory=list)
    took: list[dict[str, Any]] = field(default_factory=list)  # from the inbox's head

    @property
    def taken(self) -> int:
        """How many messages of the inbox the run took (its head)."""
        return len(self.took)

    @classmethod
    def at_claim(
        cls, store: SteerStore, session_key: str, session: Mapping[str, str] | None
    ) -> Steering:
        """A run's intake as its claim (or resume) found the session."""
        waiting = bool(session and session.get("steerQueued"))
        return cls(store, session_key, look_first=waiting)

    def continued(self, waiting: Sequence[Mapping[str, Any]]) -> Steering:
        """The intake of the same turn going on after its end step found ``waiting``
        messages (the ones it took are in the transcript now and left the inbox)."""
        return Steering(self.store, self.session_key, carried=[dict(m) for m in waiting])

    def first(self) -> list[ModelRequestPart]:
        """What joins the run's first request: the carried messages, or, when the claim
        saw some waiting, what the inbox holds (no read otherwise)."""
        if self.carried:
            entries, self.carried = self.carried, []
            self.took += entries
            return request_parts(entries)
        if self.look_first:
            self.look_first = False
            return self.take()
        return []

    def take(self) -> list[ModelRequestPart]:
        """The messages steered in since the last look (one LRANGE), as request parts."""
        entries = self.store.take(self.session_key, self.taken)
        self.took += entries
        return request_parts(entries)


def restore_steered(
    messages: Sequence[dict[str, Any]], steered: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A run's messages in transcript form with the steered ones it took as they were
    sent (their provenance kept, their text without the prefix the model was shown)."""
    shown = [(_shown_text(entry), entry) for entry in steered]
    out: list[dict[str, Any]] = []
    for message in messages:
        if shown and message.get("role") == "user" and message.get("content") == shown[0][0]:
            out.append(dict(shown.pop(0)[1]))
        else:
            out.append(message)
    return out


def _shown_text(entry: Mapping[str, Any]) -> str:
    """The text of a steered message as its run's model was shown it."""
    parts = request_parts([entry])
    return "\n".join(str(p.content) for p in parts if isinstance(p, UserPromptPart))


def request_parts(entries: Sequence[Mapping[str, Any]]) -> list[ModelRequestPart]:
    """Steered messages (transcript form) as the parts of a model request, as the model
    is shown them (an inter-session message led by its provenance line)."""
    return [
        part
        for message in to_model_messages(entries)
        if isinstance(message, ModelRequest)
        for part in message.parts
    ]
