"""dspark run on a pseudo-terminal, as in an interactive shell (progress bars, prompts, streamed text)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

from support.cli import REPO


def on_a_terminal(
    args: list[str],
    timeout: float = 120,
    *,
    env: dict[str, str] | None = None,
    answer: tuple[bytes, bytes] | None = None,
) -> tuple[int, str]:
    """Run dspark with stdin, stdout and stderr on one pty, as in an interactive shell; (exit code, what it
    showed). ``answer`` = (question, reply): type the reply once the question is on the screen."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm", **(env or {})},
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the pty
                break
            if not data:
                break
            chunks.append(data)
            if answer is not None and answer[0] in b"".join(chunks):
                os.write(master, answer[1])
                answer = None
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=30)
    return rc, b"".join(chunks).decode("utf-8", "replace")
