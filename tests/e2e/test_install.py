"""The Makefile's installs: `make venv` (tests, lint, bench) and the runtime alone that a
newcomer's first `make up` installs: uv installs the package with pip's index settings, and
plain pip takes over when uv cannot be had.

The real recipe runs against a stand-in `.venv/bin/python` that records its calls (and
plays pip), so these tests take a second and need no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"

# Plays `python -m pip`: answers `config list` like a machine with a mirror, "installs" uv
# as a script that records its arguments, or fails to when NO_UV is set.
FAKE_PYTHON = r"""#!/bin/bash
echo "python $*" >> "$CALLS"
case "$*" in
  "-m pip config list")
    echo "global.index-url='https://mirror.test/simple'"
    echo "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'"
    echo "global.find-links='/from/pip.conf'"
    echo ":env:.find-links='/from/env'" ;;
  "-m pip install --progress-bar off uv")
    [ -z "$NO_UV" ] || exit 1
    printf '#!/bin/bash\necho "uv $*" >> "$CALLS"\n' > "$(dirname "$0")/uv"
    chmod +x "$(dirname "$0")/uv" ;;
esac
"""


def make_venv(tmp_path: Path, *args: str, **env: str) -> tuple[str, list[str]]:
    """Run `make venv` (or `make ARGS`) in a project holding the real Makefile; (output,
    recorded calls)."""
    shutil.copy(MAKEFILE, tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "constraints.txt").write_text("")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["make", *(args or ("venv",))],
        cwd=tmp_path,
        env={**os.environ, "CALLS": str(calls), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if not args:
        assert (tmp_path / ".venv" / ".installed").exists()
    return done.stdout, calls.read_text().splitlines()


def test_uv_installs_the_package_from_pips_indexes(tmp_path: Path) -> None:
    """uv gets pip's index, extra indexes and links (environment over pip.conf), picks the
    best version across them, and pip never installs the package itself; everything is
    compiled to bytecode (uv's flag, then switchboard's own modules)."""
    out, calls = make_venv(tmp_path)
    assert calls[-2] == (
        "uv pip install --python .venv/bin/python --index-strategy unsafe-best-match"
        " --compile-bytecode --index-url https://mirror.test/simple"
        " --extra-index-url file:///opt/a/simple --extra-index-url file:///opt/b/simple"
        " --find-links /from/env -c constraints.txt -e .[dev]"
    )
    assert calls[-1] == "python -m compileall -q -j 0 src"
    assert not any("-e .[dev]" in call for call in calls if call.startswith("python"))
    assert "==> installing uv" in out and "==> installing switchboard" in out


def test_plain_pip_installs_when_uv_cannot_be_installed(tmp_path: Path) -> None:
    """No uv from the index: the recipe says so and installs with pip, still succeeding."""
    out, calls = make_venv(tmp_path, NO_UV="1")
    assert calls[-2:] == [
        "python -m pip install --progress-bar off -c constraints.txt -e .[dev]",  # compiles too
        "python -m compileall -q -j 0 src",
    ]
    assert not any(call.startswith("uv ") for call in calls)
    assert "installing with pip instead" in out


@pytest.mark.parametrize(("extras", "installed"), [("", "-e ."), ("otel", "-e .[otel]")])
def test_the_service_alone_installs_no_development_tools(
    tmp_path: Path, extras: str, installed: str
) -> None:
    """What `make up` installs first is the package without its dev extras (with
    `EXTRAS=otel`, with that extra), pinned by the lock."""
    stamp = ".venv/.installed-runtime" + (f"-{extras}" if extras else "")
    _, calls = make_venv(tmp_path, stamp, f"EXTRAS={extras}")
    install = next(call for call in calls if call.startswith("uv pip install"))
    assert install.endswith(f"-c constraints.txt {installed}")
    assert (tmp_path / stamp).exists() and not (tmp_path / ".venv" / ".installed").exists()
