"""Running a llama.cpp build: its cmake steps into one log with progress, under a lock per build folder.

Two ``dspark engine build`` runs of the same engine (a second terminal, ``make demo`` beside ``make test``)
wrote into one build folder and one log at once: the second reconfigured the tree under the first one's
compiler and truncated its log. The lock makes the second wait, then reuse what the first built.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dsparkcli.errors import EngineBuildError

ProgressFn = Callable[[float, str], None]
_PCT_RE = re.compile(r"^\[\s*(\d+)%\]")
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")
# the line that says why: the last log line read before the failure was often just the next step's progress
# ("[259/376] Building ...") or, with the log unflushed, the command itself (the H200 build of session 36)
_ERROR_RE = re.compile(r"\berror\b|^FAILED:", re.IGNORECASE)


@contextlib.contextmanager
def build_lock(root: Path, on_progress: ProgressFn | None = None) -> Iterator[None]:
    """Hold ``root``'s build lock (an flock on ``root/.build.lock``), waiting for another holder first."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            if on_progress:
                on_progress(-1.0, f"waiting for another dspark engine build of {root.name} (pid {holder})")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_steps(steps: Sequence[Sequence[str]], log_path: Path, on_progress: ProgressFn | None = None) -> None:
    """Run configure then build, every line into ``log_path``; the build step's percentage to ``on_progress``.
    A failing step is one EngineBuildError naming its last line and the log."""
    with open(log_path, "w", encoding="utf-8") as log:
        for i, cmd in enumerate(steps):
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                list(cmd),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
            )
            last, telling = "", ""
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    last = line.strip() or last
                    if _ERROR_RE.search(line):
                        telling = line.strip()
                    if on_progress:
                        on_progress(_percent(line) if i == 1 else -1.0, line.rstrip())
                rc = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if rc != 0:  # the compiler's or cmake's own error line, else the last line it printed
                raise EngineBuildError(
                    f"{'configure' if i == 0 else 'build'} failed (rc {rc}): {telling or last}",
                    hint=f"full log: {log_path}",
                )


def _percent(line: str) -> float:
    """make's ``[ 42%]`` or ninja's ``[12/230]`` as a percentage; -1 for any other line."""
    m = _NINJA_RE.match(line)
    if m:
        return 100.0 * int(m.group(1)) / max(1, int(m.group(2)))
    m = _PCT_RE.match(line)
    return float(m.group(1)) if m else -1.0
