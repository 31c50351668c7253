"""What a file and this machine are, for keys and records: a file's sha256 (cached: hashing a 20 GB target
takes minutes, so digests are kept in ``<cache>/hashes.json`` keyed by the resolved path and invalidated when
the file's mtime or size changes), the GPUs nvidia-smi names, and the record ``dspark engine build`` left
next to an engine. Bench's provenance and the budget wing's tuning key both read them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparkcli import config
from dsparkcli.gguf.hashes import hash_file
from dsparkcli.llama.engine import Engine

HASH_CACHE_NAME = "hashes.json"


@dataclass(frozen=True)
class FileFacts:
    path: str
    size: int
    sha256: str


def hash_cache_path() -> Path:
    return config.cache_dir() / HASH_CACHE_NAME


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # a missing or damaged cache only costs a re-hash


def _save_cache(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hashes.", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # atomic: concurrent dspark runs never read half a file
    except OSError:
        pass  # read-only cache dir: hashing still works, it is just not remembered


def file_facts(path: Path, *, cache_path: Path | None = None) -> FileFacts:
    """Size and sha256 of ``path``; the digest comes from the cache when path, mtime and size match."""
    resolved = Path(path).expanduser().resolve()
    st = resolved.stat()
    cache_path = cache_path or hash_cache_path()
    cache = _load_cache(cache_path)
    key = str(resolved)
    hit = cache.get(key)
    if (
        isinstance(hit, dict)
        and hit.get("mtime_ns") == st.st_mtime_ns
        and hit.get("size") == st.st_size
        and isinstance(hit.get("sha256"), str)
    ):
        return FileFacts(path=key, size=st.st_size, sha256=hit["sha256"])
    digest = hash_file(resolved).file_sha256
    cache = _load_cache(cache_path)  # re-read: another process may have added entries meanwhile
    cache[key] = {"mtime_ns": st.st_mtime_ns, "size": st.st_size, "sha256": digest}
    _save_cache(cache_path, cache)
    return FileFacts(path=key, size=st.st_size, sha256=digest)


def query_gpus(fields: tuple[str, ...], timeout: float = 15) -> list[str] | None:
    """nvidia-smi's CSV lines for ``--query-gpu=FIELDS`` (one per GPU); None without nvidia-smi or on failure."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def gpu_names() -> list[str]:
    """GPU names from nvidia-smi; empty when there is none (CPU runs say so through this)."""
    return query_gpus(("name",)) or []


def build_record(engine: Engine) -> dict[str, Any] | None:
    """The ``engine.json`` that ``dspark engine build`` left next to this binary, if any.

    A build from a source tarball has no git metadata, so ``llama-server --version`` shows no commit;
    the build record still names the source (commit or source hash), CUDA arch and build time.
    """
    marker = engine.bin_dir.parent.parent / "engine.json"  # <cache>/engine/<key>/build/bin
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
