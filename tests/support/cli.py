"""Running `dspark` as a user would: a subprocess of this Python."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent


def default_sigint() -> None:
    """preexec_fn: the child gets SIGINT's default disposition, as from a terminal, also when the suite
    itself was started with SIGINT ignored (a background shell: `nohup make test &`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `dspark ...` in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "dsparkcli.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=input, preexec_fn=default_sigint)


def interrupt_when(args: list[str], ready: Callable[[], bool], *, env: dict[str, str] | None = None,
                   timeout: float = 60, before: Callable[[], Any] = lambda: None) -> tuple[int, str, str, Any]:
    """Start `dspark ARGS`, wait until ``ready()`` (a failure after ``timeout`` s), call ``before()``, send
    SIGINT (Ctrl-C) and wait for the end: (exit code, stdout, stderr, what ``before`` returned)."""
    proc = subprocess.Popen([sys.executable, "-m", "dsparkcli.cli.app", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline and proc.poll() is None, f"never ready: {args}"
            time.sleep(0.05)
        seen = before()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr, seen
