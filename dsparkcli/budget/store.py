"""Stored tunings: the key of a pair as served (built here and nowhere else), the records under
``<cache>/tuning/<key id>.json``, the lookup that says which setting differs when nothing matches, and a
tuning's cost table as llama.cpp's ``--spec-cost-table`` file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsparkcli import config, facts
from dsparkcli.budget import model
from dsparkcli.budget.key import TuningKey, speed_flags
from dsparkcli.budget.record import TuningRecord, merged
from dsparkcli.errors import UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import ServerConfig


def key_for(engine: Engine, cfg: ServerConfig) -> TuningKey:
    """The tuning key of a pair served with this configuration: the files' sha256s (cached, ``facts``),
    the engine build, the GPUs and the speed-changing flags of its argv (``budget.key``). Tune, run,
    serve and bench all call this with the configuration they serve, so equal settings give equal keys."""
    assert cfg.draft is not None, "a tuning is of a draft"
    if not (engine.backend and engine.commit):
        engine = engine_mod.describe(engine)  # an engine found but not yet asked: the same key either way
    build = facts.build_record(engine)
    commit = engine.commit or (str(build.get("commit", "")) if build else "")
    gpus = facts.gpu_names()
    return TuningKey(
        target_sha256=facts.file_facts(cfg.model).sha256,
        draft_sha256=facts.file_facts(cfg.draft).sha256,
        engine_commit=commit,
        backend=engine.backend or "",
        gpu=", ".join(gpus) if gpus else "none",
        flags=speed_flags(cfg.argv(engine.server, 0)),
    )


def store_dir() -> Path:
    return config.cache_dir() / "tuning"


def _write_atomic(path: Path, text: str, prefix: str) -> None:
    """A reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=path.suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write(record: TuningRecord, path: Path) -> Path:
    """This record as JSON at ``path``, as it is (``tune --record``, partial records)."""
    _write_atomic(path, json.dumps(record.to_record(), indent=1) + "\n", ".tuning.")
    return path


def save(record: TuningRecord) -> TuningRecord:
    """Store a tune's record as ``<cache>/tuning/<key id>.json``, joined with the stored tuning of the same
    key (``record.merged``: the categories this tune did not measure are kept); returns what was stored."""
    path = store_dir() / f"{record.key.id}.json"
    old = _read(path)
    stored_rec = merged(old, record) if old is not None else record
    write(stored_rec, path)
    return stored_rec


def load(path: Path) -> TuningRecord:
    try:
        return TuningRecord.from_record(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"tuning record not found: {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"not a dspark tuning record: {path}: {e}") from None


def _read(path: Path) -> TuningRecord | None:
    try:
        return load(path)
    except UsageError:
        return None  # missing or damaged: it only costs a re-tune


def stored() -> list[TuningRecord]:
    """Every readable stored record."""
    return [r for r in (_read(p) for p in sorted(store_dir().glob("*.json"))) if r is not None]


def find(key: TuningKey) -> TuningRecord | None:
    """The complete tuning of this key written by this cost model, if there is one."""
    rec = _read(store_dir() / f"{key.id}.json")
    return rec if rec is not None and rec.key == key and rec.complete and rec.current else None


@dataclass(frozen=True)
class Match:
    record: TuningRecord | None
    why_not: str = ""  # no match: one clause that names what differs (and what to do)


def match(key: TuningKey) -> Match:
    """The tuning for this key, or why there is none, naming the setting that differs from the stored
    tunings of the same pair (the same words for --budget auto and --budget adaptive)."""
    rec = find(key)
    if rec is not None:
        return Match(rec)
    same = [r for r in stored() if r.key.same_pair(key) and r.complete]
    exact = next((r for r in same if r.key == key), None)
    if exact is not None:  # only an older model's record of these very settings
        return Match(
            None,
            f"tuning {key.id} was written by an older dspark, whose cost model charged p-min's "
            "time to accepted tokens: run `dspark tune` again",
        )
    if same:
        # the stored tuning closest to this server: fewest differences
        best = min(same, key=lambda r: len(key.differences(r.key)))
        return Match(
            None,
            "no tuning matches this pair, engine and settings: it was tuned with "
            + ", ".join(key.differences(best.key)),
        )
    return Match(
        None,
        "no tuning matches this pair, engine and settings: run `dspark tune` with the same pair and settings first",
    )


def write_cost_table(rec: TuningRecord) -> Path:
    """The tuning's cost model as llama.cpp's ``--spec-cost-table`` file, next to the record (atomic)."""
    path = store_dir() / f"{rec.key.id}.cost.txt"
    _write_atomic(path, model.cost_table(rec.cost), ".cost.")
    return path
