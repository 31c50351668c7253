"""What an engine can load, cached with its record: the archs, projector types and tensor types of
``llama.tables``, read from the source tree of a dspark build or from any other binary's libraries."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from dsparkcli.gguf.reader import ggml_types
from dsparkcli.llama import tables as tables_mod
from dsparkcli.llama.engine import BuildRecord, Engine, cached_builds, describe_backend, engine_root
from dsparkcli.llama.tables import EngineTables, TablesNotFound

TABLES_FILE = "tables.json"


def build_record(engine: Engine) -> tuple[Path, BuildRecord] | None:
    """(marker, record) of the dspark build this engine is, found by its bin folder (any way it was named)."""
    here = engine.bin_dir.resolve()
    return next(((m, r) for m, r in cached_builds() if Path(r.bin_dir).resolve() == here), None)


def _fingerprint(paths: list[Path]) -> list[list[object]]:
    out: list[list[object]] = []
    for p in paths:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def engine_label(engine: Engine) -> str:
    """How messages name an engine: its commit when known, else its path."""
    commit = engine.commit or (found[1].commit if (found := build_record(engine)) else "")
    return f"llama.cpp {commit}" if commit else str(engine.server)


def engine_tables(engine: Engine) -> EngineTables | None:
    """The archs, projector types and tensor types this engine can load, cached with its record: for a
    dspark build read from the source tree it was built from (exact), for any other binary from its
    shared libraries (see ``llama.tables``). None when neither holds the tables where dspark looks."""
    found = build_record(engine)
    record = found[1] if found else None
    if found:
        cache = found[0].parent / TABLES_FILE
        src = Path(record.compiled_source)  # type: ignore[union-attr]
        inputs = [
            src / rel
            for rel in (
                tables_mod.ARCH_SOURCE,
                tables_mod.PROJECTOR_SOURCE,
                tables_mod.TYPE_ENUM_SOURCE,
                tables_mod.TYPE_TRAITS_SOURCE,
            )
        ]
    else:
        key = hashlib.sha256(str(engine.bin_dir.resolve()).encode()).hexdigest()[:16]
        cache = engine_root() / "tables" / f"{key}.json"
        inputs = []
    try:
        if not found or not all(p.is_file() for p in inputs):  # a user's binary, or a build whose tree is gone
            inputs = [engine.server, *tables_mod.library_files(engine.bin_dir, engine.server).values()]
        stamp = _fingerprint(inputs)
    except (TablesNotFound, OSError):
        return None
    try:
        cached = json.loads(cache.read_text())
        if cached.get("inputs") == stamp and (hit := tables_mod.from_record(cached)) is not None:
            return hit
    except (OSError, ValueError, AttributeError):
        pass
    try:
        if inputs[0] != engine.server:
            result = tables_mod.from_source(Path(record.compiled_source))  # type: ignore[union-attr]
        else:
            result = tables_mod.from_libraries(
                engine.bin_dir, engine.server, {v[0]: k for k, v in ggml_types().items()}
            )
    except (TablesNotFound, OSError):
        return None
    backend = (record.backend if record else "") or engine.backend or describe_backend(engine)
    result = dataclasses.replace(result, backend=backend, cuda_arch=record.cuda_arch if record else "")
    try:  # a cache that cannot be written costs a re-read next time, nothing more
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**tables_mod.to_record(result), "inputs": stamp}, indent=1))
        os.replace(tmp, cache)
    except OSError:
        pass
    return result
