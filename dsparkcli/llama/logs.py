"""Reading llama-server's and ggml-rpc-server's logs: why a child died, its most telling line, its tail."""

from __future__ import annotations

import os
import re
from pathlib import Path

_RPC_FAILURE = (
    r"Remote RPC server crashed|Failed to connect to \S+:\d+|RPC handshake failed|RPC server version mismatch"
)

# common/arg.cpp's refusal of an argument (e.g. one given after `--`): the log's first line; the usage it
# prints next ends in "to show complete usage, run with -h", which says nothing about the cause
_ARGUMENT = r"error while handling argument|error: invalid argument"

# First match wins: the specific causes before the generic "crash".
_LOAD_FAILURES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("usage", re.compile(_ARGUMENT), "llama-server refused an argument"),
    (
        "unsupported-arch",
        re.compile(
            r"unknown model architecture|layer input tensor is null|target_layer_ids|"
            r"dflash requires ctx_other to be set(?!.*normal)"
        ),
        "the model architecture is not supported for this use",
    ),
    ("missing-file", re.compile(r"failed to open GGUF file"), "a model file is missing"),
    (
        "bad-gguf",
        re.compile(
            r"invalid magic|failed to read (magic|header|key)|tensor data is not within|"
            r"gguf_init_from_file_impl: .*(invalid|failed)"
        ),
        "a model file is not a valid GGUF",
    ),
    (
        "out-of-memory",
        re.compile(
            r"out of memory|cudaMalloc failed|failed to allocate|unable to allocate|ErrorOutOfDeviceMemory", re.I
        ),
        "not enough memory to load the model",
    ),
    ("port", re.compile(r"couldn't bind|Address already in use|bind\(\) failed", re.I), "the port is already in use"),
    # ggml-rpc aborts the whole llama-server when a worker cannot be reached or dies mid-graph
    ("rpc", re.compile(_RPC_FAILURE), "an RPC worker is unreachable or died"),
    ("crash", re.compile(r"GGML_ASSERT|Segmentation fault|terminate called"), "llama-server crashed"),
)


def classify_log(text: str) -> tuple[str, str]:
    """(kind, summary) of why a server died, from its log."""
    for kind, pattern, summary in _LOAD_FAILURES:
        if pattern.search(text):
            return kind, summary
    return "error", "llama-server exited"


_ABORT = re.compile(r"\.(?:c|cpp|cu|h):\d+: \S|GGML_ASSERT")


def abort_line(text: str) -> str | None:
    """ggml_abort's "file.cpp:LINE: message" (or a GGML_ASSERT), the last one in the log, if any."""
    hits = [ln.strip() for ln in text.splitlines() if _ABORT.search(ln)]
    return hits[-1][:300] if hits else None


def key_line(text: str) -> str:
    """The most telling log line: an assert, an error, or the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # ggml_abort's "file.cpp:LINE: message" says more than the gdb backtrace printed after it
    for pattern in (
        _ARGUMENT,
        _RPC_FAILURE,
        r"\.(?:c|cpp|cu):\d+: \S",
        r"GGML_ASSERT|error:|failed to open GGUF|invalid magic|exception|couldn't bind",
    ):
        for ln in lines:
            if re.search(pattern, ln) and "this warning is normal" not in ln:
                return ln[:300]
    return lines[-1][:300] if lines else "no output"


def log_tail(path: Path | None, n: int = 30) -> str:
    """The last ``n`` lines of a child's log (read from its last 64 KiB)."""
    if not path or not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64 * 1024))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-n:])


# ggml-rpc-server's own failures (its messages, not llama-server's)
_WORKER_FAILURES = (
    ("port", ("Failed to create server socket",), "the port is already in use or cannot be bound"),
    (
        "device",
        ("unknown device", "No devices found", "Failed to create backend", "invalid device"),
        "the worker has no such device",
    ),
    ("usage", ("unknown argument", "Invalid parameters", "invalid number of threads"), "bad worker arguments"),
)


def classify_worker_log(text: str) -> tuple[str, str, str]:
    """(kind, summary, telling line) of why an rpc worker died, from its log."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for kind, needles, summary in _WORKER_FAILURES:
        for ln in lines:
            if any(n in ln for n in needles):
                return kind, summary, ln[:200]
    return "error", "the worker exited", (lines[-1][:200] if lines else "no output")
