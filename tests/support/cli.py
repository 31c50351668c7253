"""Running `dspark` as a user would: a subprocess of this Python, or in this process where that is the same."""

from __future__ import annotations

import contextlib
import io
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


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `dspark ...` in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dsparkcli.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        input=input,
        preexec_fn=default_sigint,
    )


# Environment that dspark reads when a command runs (so setting it around an in-process call is the same as a
# child's environment); HF_ENDPOINT too: dspark reads it per call and hands it to every hub call
# (hub.cache.hf_endpoint). Anything else (the rest of HF_* is read when huggingface_hub is imported, COLUMNS and
# TERM when the consoles are made) is read once per process: a call that sets it runs in a subprocess.
PER_CALL_ENV = ("DSPARK_", "PIP_", "LLAMA_", "PATH", "PYTHONPATH", "HOME", "XDG_", "HF_ENDPOINT")


def in_process_is_same(env: dict[str, str] | None) -> bool:
    return all(k.startswith(PER_CALL_ENV) for k in env or {})


def run_cli_in_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`dspark ARGS` through ``cli.main`` in this process, stdio captured: what run_cli gives, without a new
    interpreter (~0.3 s each). For commands that start no engine and need no signals, real pipes or an
    environment read at import; ``timeout`` is accepted for the same call shape (nothing here can hang on a
    child). Falls back to run_cli when ``env`` holds a setting read once per process."""
    if not in_process_is_same(env):
        return run_cli(*args, env=env, timeout=timeout, cwd=cwd, input=input)
    from dsparkcli.cli import _common, app, main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in env or {}}
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_stdin, cwd_before = sys.stdin, os.getcwd()
    code: int | str | None = 0
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO(input or "")  # not a terminal, as a subprocess of the suite sees it
        _common.PASSTHROUGH.clear()  # main sets it only when `--` is given
        app._INTERRUPTED.clear()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(args))
            except SystemExit as e:
                code = e.code
    finally:
        sys.stdin = saved_stdin
        os.chdir(cwd_before)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
    if isinstance(code, str):  # sys.exit("message"): printed to stderr, exit 1, as the interpreter does
        stderr.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(["dspark", *args], code or 0, stdout.getvalue(), stderr.getvalue())


def interrupt_when(
    args: list[str],
    ready: Callable[[], bool],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    before: Callable[[], Any] = lambda: None,
) -> tuple[int, str, str, Any]:
    """Start `dspark ARGS`, wait until ``ready()`` (a failure after ``timeout`` s), call ``before()``, send
    SIGINT (Ctrl-C) and wait for the end: (exit code, stdout, stderr, what ``before`` returned)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=default_sigint,
    )
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
