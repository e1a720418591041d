"""The code keeps one style: ruff's pycodestyle and pyflakes rules at 120 columns (pyproject.toml [tool.ruff])."""
import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
