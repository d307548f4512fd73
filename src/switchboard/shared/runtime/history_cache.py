"""A run's history in model form, made once per message instead of once per run.

With its fast paths on, a worker keeps the last messages of the sessions it runs
(`store.windows.TranscriptWindows`): a claim reads from Redis only the messages newer than
the window it holds, and hands the run the window's entries (`Claim.entries`). Each entry
keeps its message's model form (`transcript.model_unit`) in its ``memo`` slot, made the
first time a run needs it; a run then only folds the forms into pydantic-ai messages
(`transcript.fold_units`), the same messages `transcript.to_model_messages` makes from the
same transcript. So a run in a session holding a thousand messages reads, decodes and
converts the few messages added since the session's last run, not the last 200.

What a run is sent does not depend on whether the windows are used: the same messages,
from the same point (the first user message of the window, so the model never sees an
orphaned tool result).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage

from switchboard.shared.runtime.transcript import ModelUnit, fold_units, model_unit
from switchboard.shared.store.windows import HistoryEntry

__all__ = ["model_history"]


def model_history(entries: Sequence[HistoryEntry]) -> list[ModelMessage]:
    """The model's history from a window's entries (oldest first), starting at the first
    user message; each entry's model form is made once and kept on the entry."""
    start = next((i for i, e in enumerate(entries) if e.message.get("role") == "user"), 0)
    units: list[ModelUnit] = []
    for entry in entries[start:]:
        unit = entry.memo
        if unit is None:
            unit = entry.memo = model_unit(entry.message)
        units.append(unit)
    return fold_units(units)
