"""Which broker queue a run goes to: a batch line's run to its own queue."""

from __future__ import annotations

import pytest

from switchboard.shared.batches.lines import line_session
from switchboard.shared.batches.plans import CHAT, LinePlan
from switchboard.workers.routing import ALL_QUEUES, BATCH_QUEUE, RUNS_QUEUE, run_queue

pytestmark = pytest.mark.unit


def test_batch_line_runs_go_to_the_batch_queue() -> None:
    """A line's own session routes its run to sb.batch; any other session to sb.runs."""
    plan = LinePlan(custom_id="a", agent_id="main", endpoint=CHAT, text="hi", line=1)
    own = line_session("batch_0123abcd", 4, plan)
    assert own == "agent:main:batch:batch_0123abcd:4"
    assert run_queue(own) == BATCH_QUEUE and BATCH_QUEUE in ALL_QUEUES
    assert run_queue("agent:main:main") == RUNS_QUEUE
    assert run_queue("agent:main:openai-user:batch") == RUNS_QUEUE
