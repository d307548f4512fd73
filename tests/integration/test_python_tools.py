"""Python tools from the `switchboard.tools` entry-point group, over the real worker,
Redis and api: the example package `examples/python-tools` made visible to this process
with a dist-info of its own on a temporary sys.path entry (as `pip install` would)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).resolve().parents[2] / "examples" / "python-tools"
MAIN = "agent:main:main"


@pytest.fixture
def units_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example package's entry points and modules, importable in this process."""
    site = tmp_path / "site"
    info = site / "switchboard_units-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: switchboard-units\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[switchboard.tools]\n"
        "units = switchboard_units:toolset\n"
        "shout = switchboard_units:shout\n"
        "broken = switchboard_units:no_such_thing\n"
    )
    monkeypatch.syspath_prepend(str(PACKAGE / "src"))
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def config_data(units_installed: None, request: pytest.FixtureRequest) -> dict[str, Any]:
    """No MCP servers; the test's own keys (indirect parametrization)."""
    return dict(getattr(request, "param", {}))


def reply(rpc: Callable[..., Any], message: str, session: str = MAIN) -> str:
    """The reply of one turn run to its end."""
    started = rpc("agent", sessionKey=session, message=message)
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=30_000)
    assert outcome["status"] == "ok", outcome
    return str(outcome.get("reply"))


def test_a_run_calls_python_tools_from_an_installed_package(
    worker: Any, rpc: Callable[..., Any], client: Any
) -> None:
    """A toolset and a plain function are offered as <entry>__<tool>; a broken entry point
    is skipped; the call is recorded on its toolResult."""
    assert reply(rpc, '/tool units__celsius_to_fahrenheit {"celsius": 100}') == "212.0"
    assert reply(rpc, '/tool shout__shout {"text": "hey"}') == "HEY"
    answer = client.post(
        "/tools/invoke",
        json={"tool": "sessions_history", "args": {"sessionKey": MAIN, "includeTools": True}},
    ).json()["result"]
    calls = [m["call"] for m in answer["messages"] if m["role"] == "toolResult"]
    assert [(c["kind"], c["server"], c["tool"], c["outcome"]) for c in calls] == [
        ("python", "units", "celsius_to_fahrenheit", "ok"),
        ("python", "shout", "shout", "ok"),
    ]


def test_a_python_tool_that_raises_is_a_tool_error(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A function's exception goes back to the model as a tool error; the run ends ok; the
    package's calls and errors are counted in the process's metrics like a server's."""
    assert reply(rpc, '/tool units__km_to_miles {"km": 1}').startswith("0.62")
    text = reply(rpc, '/tool units__km_to_miles {"km": -1}')
    assert "cannot be negative" in json.loads(text)["error"]
    sample = services.metrics.registry.get_sample_value
    assert sample("switchboard_tool_calls_total", {"server": "units"}) == 2
    assert sample("switchboard_tool_errors_total", {"server": "units", "kind": "error"}) == 1


@pytest.mark.parametrize("config_data", [{"tools": {"deny": ["shout__*"]}}], indirect=True)
def test_python_tools_follow_tools_deny(worker: Any, rpc: Callable[..., Any]) -> None:
    """A denied Python tool is not offered; the package's others are."""
    text = reply(rpc, '/tool shout__shout {"text": "hey"}')
    assert "Unknown tool name" in text and "'units__km_to_miles'" in text
