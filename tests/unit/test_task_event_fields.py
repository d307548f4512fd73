"""What a run's task events say (their fields), and the setting that turns them off."""

from __future__ import annotations

import pytest

from switchboard.shared.config import Settings
from switchboard.shared.store.runs import RunRecord
from switchboard.workers.app import create_celery_app
from switchboard.workers.task_events import RESULT_CHARS, end_fields, run_kwargs, task_events

pytestmark = pytest.mark.unit


def _ended(status: str, **fields: object) -> RunRecord:
    return RunRecord(
        run_id="r1",
        session_key="agent:ops:main",
        status=status,
        started_at_ms=1_000,
        ended_at_ms=4_250,
        **fields,  # type: ignore[arg-type]
    )


def test_an_ok_run_succeeds_with_its_runtime_and_the_start_of_its_reply() -> None:
    """An ok run's end is task-succeeded: runtime from its start to its end, the status
    and the first line of its reply, cut short."""
    fields = end_fields("ok", _ended("ok", reply="x" * 500 + "\nsecond line"))
    assert fields["type"] == "task-succeeded"
    assert fields["runtime"] == 3.25
    assert fields["result"].startswith("{'status': 'ok', 'reply': 'xxx")
    assert "second line" not in fields["result"]
    assert len(fields["result"]) < RESULT_CHARS + 40


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("error", "ModelAPIError: boom\nTraceback ...", "error: ModelAPIError: boom"),
        ("timeout", "run timed out after 3s", "timeout: run timed out after 3s"),
        ("lost", None, "lost: lost"),
    ],
)
def test_a_failed_run_fails_with_its_error_on_one_line(
    status: str, error: str | None, expected: str
) -> None:
    """error, timeout and lost end as task-failed, the error's first line as exception."""
    fields = end_fields(status, _ended(status, error=error))
    assert fields["type"] == "task-failed" and fields["exception"] == expected
    assert "traceback" not in fields


def test_a_cancelled_run_is_revoked() -> None:
    """A cancelled run (subagents cancel, a revoke) ends as task-revoked."""
    assert end_fields("cancelled", _ended("cancelled"))["type"] == "task-revoked"


def test_kwargs_name_the_session_agent_label_and_parent() -> None:
    """A run's kwargs: its ids, its agent, its label and the session that spawned it."""
    run = RunRecord(run_id="r2", session_key="agent:ops:subagent:abc", status="running")
    run.meta = {"label": "kid"}
    kwargs = run_kwargs(run, {"spawnedBy": "agent:ops:main"})
    assert kwargs == {
        "runId": "r2",
        "sessionKey": "agent:ops:subagent:abc",
        "agentId": "ops",
        "label": "kid",
        "parent": "agent:ops:main",
    }
    assert "parent" not in run_kwargs(RunRecord("r3", "agent:ops:main", "running"), {})


@pytest.mark.parametrize("on", [True, False])
def test_task_events_follow_the_setting(on: bool) -> None:
    """SWITCHBOARD_TASK_EVENTS switches the worker's task events and the runs' alike."""
    app = create_celery_app(Settings(redis_url="redis://127.0.0.1:1/0", task_events=on))
    assert app.conf.worker_send_task_events is on
    events = task_events(app)
    assert events is not None and events.enabled is on
