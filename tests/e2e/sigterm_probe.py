"""Not collected by the suite (no ``test_`` prefix): `test_sigterm` runs it in a pytest of
its own and stops that pytest with SIGTERM while this test holds a private redis-server."""

from __future__ import annotations

import os
import time
from pathlib import Path

from switchboard.supervisor.redis_server import RedisServer


def test_holds_a_private_server(redis_server: RedisServer) -> None:
    Path(os.environ["SIGTERM_PROBE_PID_FILE"]).write_text(str(redis_server.pid))
    time.sleep(120)  # stopped by the SIGTERM long before
