"""Schema-driven fuzzing of `/rpc` and `/tools/invoke` against the real api: never a 5xx.

Schemathesis reads the api's OpenAPI document (what `/openapi.json` serves), then
generates valid and invalid bodies (examples, coverage of boundaries and types, and
random fuzzing) for both operations. The api runs on uvicorn with a real queue, a real
worker and a private Redis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig

pytestmark = pytest.mark.integration

TOKEN = "test-token"  # the integration conftest's token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES_PER_OPERATION = 660
MIN_REQUESTS_PER_OPERATION = 1000


@pytest.fixture
def fuzz_log() -> Iterator[Counter[int]]:
    """Status codes of every fuzzed request; at teardown, enough requests and no 5xx."""
    statuses: Counter[int] = Counter()
    yield statuses
    total = sum(statuses.values())
    print(f"fuzzed {total} requests: {dict(sorted(statuses.items()))}")
    assert total >= MIN_REQUESTS_PER_OPERATION, f"only {total} requests fuzzed"
    assert not [code for code in statuses if code >= 500], statuses


def _api_document() -> dict[str, Any]:
    """The OpenAPI document the api serves at `/openapi.json` (built without starting it)."""
    settings = Settings(token=TOKEN, redis_url="redis://127.0.0.1:1/0")
    return create_app(settings, SwitchboardConfig()).openapi()


schema = schemathesis.openapi.from_dict(_api_document()).include(
    path_regex=r"^/(rpc|tools/invoke)$"
)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_fuzzed_bodies_never_get_a_server_error(
    case: schemathesis.Case, api_url: str, worker: Any, fuzz_log: Counter[int]
) -> None:
    """Any body, valid or not, is answered 2xx/4xx, never 5xx."""
    response = case.call(base_url=api_url, headers=AUTH, timeout=30)
    fuzz_log[response.status_code] += 1
    case.validate_response(response, checks=[not_a_server_error])
