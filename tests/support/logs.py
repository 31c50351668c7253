"""Reading what llama-server logged for one request."""

from __future__ import annotations

import time
from pathlib import Path


def request_log(path: Path, start: int, timeout_s: float = 10.0) -> str:
    """The log of one finished request, from byte ``start``. The HTTP answer can arrive before
    llama-server's log thread has written the request's last lines (on a loaded machine, several draft
    calls were missing): wait for the slot's release line, which comes after every line of the request."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = path.read_bytes()[start:].decode(errors="replace")
        if "stop processing" in log or time.monotonic() > deadline:
            return log
        time.sleep(0.05)
