"""`make bench` runs both passes (fast paths on, then off) whatever the first one found,
and fails only when the fast-paths-on pass missed a target or either pass was incomplete.

The real recipe runs against a stand-in `switchboard` that records its calls and exits
with the code each pass is told to, so these tests take a second.
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

# Plays `switchboard bench`: records its arguments, exits with $ON or $OFF by the pass.
FAKE_SWITCHBOARD = r"""#!/bin/bash
echo "switchboard $*" >> "$CALLS"
case "$*" in
  *"--fast-paths on"*) exit "$ON" ;;
  *"--fast-paths off"*) exit "$OFF" ;;
esac
exit 99
"""


def make_bench(tmp_path: Path, on: int, off: int) -> tuple[int, str, list[str]]:
    """`make bench` in a project holding the real Makefile and an installed stand-in venv;
    (exit code, output, recorded calls)."""
    shutil.copy(MAKEFILE, tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(shutil.which("true") or "/bin/true")
    fake = bin_dir / "switchboard"
    fake.write_text(FAKE_SWITCHBOARD)
    fake.chmod(0o755)
    (tmp_path / ".venv" / ".installed").touch()  # newer than pyproject.toml: venv is done
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["make", "bench"],
        cwd=tmp_path,
        env={**os.environ, "CALLS": str(calls), "ON": str(on), "OFF": str(off)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr, calls.read_text().splitlines()


PASSES = [
    "switchboard bench --fast-paths on --out bench/results",
    "switchboard bench --fast-paths off --out bench/results/fast-paths-off",
]


@pytest.mark.parametrize(
    ("on", "off", "fails"),
    [
        (0, 0, False),
        (0, EXIT_MISSED, False),  # the plain path is slower than the targets: its price
        (EXIT_MISSED, 0, True),  # the product missed a target
        (EXIT_MISSED, EXIT_MISSED, True),
        (0, EXIT_INCOMPLETE, True),  # the plain path failed a check or could not run
        (EXIT_INCOMPLETE, 0, True),
    ],
)
def test_both_passes_run_and_the_verdict_reads_both(
    tmp_path: Path, on: int, off: int, fails: bool
) -> None:
    code, out, calls = make_bench(tmp_path, on, off)
    assert [c.replace(str(tmp_path) + "/", "") for c in calls] == PASSES, out
    assert (code != 0) is fails, out
    assert f"fast paths on: exit {on}; off: exit {off}" in out
