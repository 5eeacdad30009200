"""The repository passes its linter: ruff, with the rules and the 140-character line limit of
ruff.toml. A change that breaks them turns ``make test`` red instead of waiting for a review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_passes_ruff_with_its_line_length_limit():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, f"ruff check found problems (fix them, or run `ruff check --fix`):\n{done.stdout}{done.stderr}"
