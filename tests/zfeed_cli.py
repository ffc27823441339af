"""Running the installed `zfeed` command from the Python tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def zfeed_command() -> str:
    beside = Path(sys.executable).parent / "zfeed"
    if beside.exists():
        return str(beside)
    found = shutil.which("zfeed")
    if not found:
        pytest.skip("the zfeed command is not installed (make python)")
    return found


def run(*args, ok=True, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    result = subprocess.run([zfeed_command(), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                            cwd=cwd)
    if ok:
        assert result.returncode == 0, f"zfeed {' '.join(map(str, args))} failed ({result.returncode}): {result.stderr}"
    return result
