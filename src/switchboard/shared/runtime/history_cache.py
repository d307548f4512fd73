"""A run's history in model form, made once per message instead of once per run.

A worker keeps the last messages of the sessions it runs
(`store.windows.TranscriptWindows`): a claim reads from Redis only the messages newer than
the window it holds, and hands the run the window's entries (`Claim.entries`). Each entry
keeps in its ``memo`` slot what the runtime derived from its message (`_Memo`): its model
form (`transcript.model_unit`), made the first time a run needs it, and, on the last
message of a run of request messages that a response follows, the request they fold into
(`transcript.fold_request`). Such a run never changes (a transcript only grows), so later
runs take that request as it is and fold only the messages after the last response. So a
run in a session holding a thousand messages reads, decodes and converts the few messages
added since the session's last run, not the last 200, and folds only those too.

What a run is sent does not depend on whether the windows are used: the same messages as
`transcript.to_model_messages` makes from the same transcript, from the same point (the
first user message of the window, so the model never sees an orphaned tool result). The
messages are shared by the runs that read them, as the entries are: nothing changes them
(a run replaces its last request to add instructions, `agent_loop`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse

from switchboard.shared.runtime.transcript import ModelUnit, fold_request, model_unit
from switchboard.shared.store.windows import HistoryEntry

__all__ = ["model_history"]


class _Memo:
    """What an entry's message is in model form: its ``unit``; and ``folded``, set on the
    last of a run of request messages that a response follows: the seq of the run's first
    message (the window's start can cut a run) and the request the run folds into (None
    when it holds no part). One tuple, so a run reading it never sees half of an update
    another run is making."""

    __slots__ = ("folded", "unit")

    def __init__(self, unit: ModelUnit) -> None:
        self.unit = unit
        self.folded: tuple[int, ModelRequest | None] | None = None


def model_history(entries: Sequence[HistoryEntry]) -> list[ModelMessage]:
    """The model's history from a window's entries (oldest first), starting at the first
    user message: what `transcript.fold_units` makes of their model forms, each made once
    and kept on its entry, and each request a response follows folded once."""
    start = next((i for i, e in enumerate(entries) if e.message.get("role") == "user"), 0)
    out: list[ModelMessage] = []
    pending: list[HistoryEntry] = []  # the request messages since the last response
    for entry in entries[start:]:
        memo = entry.memo
        if memo is None:
            memo = entry.memo = _Memo(model_unit(entry.message))
        if isinstance(memo.unit, ModelResponse):
            if pending and (request := _closed_request(pending)) is not None:
                out.append(request)
            pending = []
            out.append(memo.unit)
        else:
            pending.append(entry)
    if pending and (request := fold_request([e.memo.unit for e in pending])) is not None:
        out.append(request)
    return out


def _closed_request(run: Sequence[HistoryEntry]) -> ModelRequest | None:
    """The request a run of request messages that a response follows folds into: kept on
    its last entry, keyed by its first entry's seq."""
    last: _Memo = run[-1].memo
    folded = last.folded
    if folded is None or folded[0] != run[0].seq:
        folded = last.folded = (run[0].seq, fold_request([e.memo.unit for e in run]))
    return folded[1]
