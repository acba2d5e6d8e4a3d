"""The code as pyproject.toml's ruff settings read it (line length 100; pycodestyle,
pyflakes, isort, pyupgrade, bugbear) and as `ruff format` writes it, every file of the
project: a rule broken fails here, not in a reviewer's reading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, scaled

pytestmark = pytest.mark.integration  # ruff is a process of its own


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_every_file_passes_ruff(command):
    ruff = Path(sys.executable).parent / "ruff"
    proc = subprocess.run(
        [str(ruff), *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=scaled(60)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
