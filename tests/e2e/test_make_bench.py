"""`make bench` runs the benchmark suite three times into bench/results (the median run of
each scenario kept) and fails as it does: on a scenario that could not run or failed a
check, or on a missed target.

The real recipe runs against a stand-in `switchboard` that records its calls and exits
with the code it is told to, so these tests take a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from switchboard_bench import EXIT_INCOMPLETE, EXIT_MISSED

pytestmark = pytest.mark.e2e

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"

# Plays `switchboard bench`: records its arguments, exits with $CODE.
FAKE_SWITCHBOARD = r"""#!/bin/bash
echo "switchboard $*" >> "$CALLS"
exit "$CODE"
"""


def make_bench(tmp_path: Path, code: int) -> tuple[int, str, list[str]]:
    """`make bench` in a project holding the real Makefile and an installed stand-in venv;
    (exit code, output, recorded calls)."""
    shutil.copy(MAKEFILE, tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "constraints.txt").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(shutil.which("true") or "/bin/true")
    fake = bin_dir / "switchboard"
    fake.write_text(FAKE_SWITCHBOARD)
    fake.chmod(0o755)
    (tmp_path / ".venv" / ".installed").touch()  # newer than its inputs: the venv is done
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["make", "bench"],
        cwd=tmp_path,
        env={**os.environ, "CALLS": str(calls), "CODE": str(code)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr, calls.read_text().splitlines()


@pytest.mark.parametrize("code", [0, EXIT_MISSED, EXIT_INCOMPLETE])
def test_one_pass_into_bench_results_and_its_verdict_is_makes(tmp_path: Path, code: int) -> None:
    """One `switchboard bench --repeat 3 --out bench/results`; make fails exactly when it
    did."""
    done, out, calls = make_bench(tmp_path, code)
    assert [c.replace(str(tmp_path) + "/", "") for c in calls] == [
        "switchboard bench --repeat 3 --out bench/results"
    ], out
    assert (done != 0) is (code != 0), out
