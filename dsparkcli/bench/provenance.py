"""Where a benchmark figure came from: dspark and engine versions, GPU, argv, and the files' sha256
(cached, ``dsparkcli.facts``)."""

from __future__ import annotations

import datetime as _dt
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dsparkcli import __version__
from dsparkcli.facts import FileFacts, build_record, file_facts, gpu_names, hash_cache_path, query_gpus
from dsparkcli.llama.engine import Engine

__all__ = ["FileFacts", "build_record", "collect", "file_facts", "gpu_facts", "gpu_names", "hash_cache_path"]

GPU_FACT_FIELDS = (
    ("name", "name"),
    ("memory_total", "memory.total"),
    ("driver", "driver_version"),
    ("mem_clock_max", "clocks.max.memory"),
)


def gpu_facts() -> dict[str, Any]:
    """The first GPU's name, memory, driver and memory clock, and the GPU count (the GPU study's record);
    falls back to the name alone when the driver rejects a field."""
    if not shutil.which("nvidia-smi"):
        return {"name": "none (CPU)"}
    for n_fields in (len(GPU_FACT_FIELDS), 1):
        keys, fields = zip(*GPU_FACT_FIELDS[:n_fields])
        lines = query_gpus(fields, timeout=20)
        if lines:
            return dict(zip(keys, lines[0].split(", "))) | {"count": len(lines)}
    return {"name": "unknown"}


def collect(
    engine: Engine,
    files: dict[str, Path | None],
    *,
    argv: list[str] | None = None,
    reps: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance block every bench record carries."""
    facts = {role: asdict(file_facts(p)) for role, p in files.items() if p is not None}
    gpus = gpu_names()
    build = build_record(engine)
    commit = engine.commit or (str(build.get("commit", "")) if build else "")
    return {
        "dspark_version": __version__,
        "engine": {
            "server": str(engine.server),
            "version": engine.version,
            "commit": commit,
            "backend": engine.backend,
            "build": build,
        },
        "gpu": ", ".join(gpus) if gpus else "none",
        "argv": list(sys.argv if argv is None else argv),
        "files": facts,
        "reps": reps,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
