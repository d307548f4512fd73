"""The `switchboard` command: runs the processes and talks to a running api.

Process commands (`up`, `api`, `worker`, `beat`, `flower`) read `--config` /
SWITCHBOARD_CONFIG and the SWITCHBOARD_* settings. Client commands (`send`, `sessions`,
`history`) call the api over HTTP with the bearer token (SWITCHBOARD_TOKEN, else the token
`up` saved in the data directory).
"""

from __future__ import annotations

import sys

from rich.markup import escape

from switchboard.cli.common import _exit_code, app, err
from switchboard.shared.errors import SwitchboardError

# The command modules register their commands on `app` as they are imported: this order is
# the order of `switchboard --help`.
# isort: off
from switchboard.cli import stack
from switchboard.cli import processes
from switchboard.cli import health
from switchboard.cli import client
from switchboard.cli import bench
from switchboard.cli import tokens
from switchboard.cli import batch
# isort: on

__all__ = ["app", "batch", "bench", "client", "health", "main", "processes", "stack", "tokens"]


def main() -> None:
    """Entry point: domain errors print as one clear line, never a stack trace."""
    try:
        app()
    except SwitchboardError as exc:
        err.print(f"[red]error:[/] {escape(exc.message)}")
        sys.exit(_exit_code(exc))
