"""Running `dspark` as a user would: a subprocess of this Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `dspark ...` in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "dsparkcli.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=input)
