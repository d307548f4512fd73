"""Archival of sub-agent sessions: export the transcript as JSONL, then delete the session.

A finished child is scheduled in ``archive_due`` (``archiveAfterMinutes`` after its
announce; ``cleanup: "delete"`` archives it at once). The sweep archives what is due.
Every step is idempotent: the export is written atomically (temp file + rename) and only
while the session still exists, and deleting a deleted session does nothing.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import orjson

from switchboard.shared.services import Services
from switchboard.shared.store.sessions import SessionEntry

log = logging.getLogger("switchboard.archive")

# A due session that is busy (a run holds its lane) is looked at again after this long.
_BUSY_RETRY_MS = 60_000


def transcript_path(svc: Services, session_id: str) -> Path:
    """Where a session's JSONL transcript is written on export and archive (SPEC §9)."""
    return svc.settings.data_dir / "sessions" / f"{session_id}.jsonl"


def schedule_archive(svc: Services, session_key: str, at_ms: int) -> None:
    """Archive a sub-agent session at ``at_ms`` (an earlier schedule is kept)."""
    svc.store.spawns.schedule_archive(session_key, at_ms)


def export_transcript(svc: Services, entry: SessionEntry) -> Path | None:
    """Write the session's transcript, one message per line, atomically; returns the path.

    None when the session was deleted meanwhile (another sweep archived it): an existing
    export is never overwritten with an empty transcript."""
    messages = svc.store.transcripts.all(entry.key)
    if not svc.store.sessions.exists(entry.key):
        return None
    path = transcript_path(svc, entry.session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("wb") as out:
            for message in messages:
                message.pop("__openclaw", None)
                out.write(orjson.dumps(message) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def archive_session(svc: Services, session_key: str) -> bool:
    """Export and delete a session now; False when it is gone already or busy."""
    entry = svc.store.sessions.get(session_key)
    if entry is None or svc.store.runs.lane_holder(session_key):
        return False
    if export_transcript(svc, entry) is None:
        return False
    svc.store.sessions.delete(session_key)
    return True


def sweep_archive(svc: Services, now_ms: int) -> int:
    """Archive every sub-agent session whose time has come; returns how many."""
    records = svc.store.spawns
    archived = 0
    # Taken, not just read: a sweep running beside this one archives none of these.
    for key in records.take_due_archives(now_ms, _BUSY_RETRY_MS):
        if not svc.store.sessions.exists(key):
            records.unschedule_archive(key)
            continue
        if not archive_session(svc, key):
            records.postpone_archive(key, now_ms + _BUSY_RETRY_MS)
            continue
        records.unschedule_archive(key)
        archived += 1
    if archived:
        log.info("archived %d sub-agent session(s)", archived)
    return archived
