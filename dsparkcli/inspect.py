"""The `dspark inspect` job: read headers (local or hf://), summarise them, and, as asked, hash, diff,
estimate memory, check a pair and hold files to their models.toml pins.

The analysis itself lives in ``gguf`` (reader, analysis, pairing); remote headers come from ``hub.range``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparkcli.errors import DsparkError, UsageError
from dsparkcli.gguf.analysis import (
    Census,
    DSparkStructure,
    MetadataSummary,
    census,
    dspark_structure,
    metadata_json,
    printable,
    role_of,
    summarize,
)
from dsparkcli.gguf.hashes import FileHashes, TensorDiff, diff_tensors, hash_file
from dsparkcli.gguf.loadable import PairCheck, check_loads
from dsparkcli.gguf.memory import KV_TYPE_BYTES, MemoryEstimate, layer_bytes, memory_estimate
from dsparkcli.gguf.pairing import PairVerdict, check_pair, mmproj_width
from dsparkcli.gguf.reader import GGUFHeader, TensorInfo
from dsparkcli.hub import registry
from dsparkcli.hub.model_file import ModelFile
from dsparkcli.hub.range import read_gguf
from dsparkcli.hub.registry import ModelPair
from dsparkcli.llama.placement import DeviceShare, device_bytes
from dsparkcli.llama.tables import EngineTables

# ------------------------------------------------------------------ models.toml expectations


@dataclass(frozen=True)
class ExpectCheck:
    name: str  # size | census | sha256
    ok: bool | None  # None: not pinned or not computable
    expected: Any
    actual: Any


@dataclass(frozen=True)
class ExpectVerdict:
    model: str
    role: str
    key: str
    pinned_file: str
    ok: bool
    checks: tuple[ExpectCheck, ...]
    explicit: bool = True  # False: matched automatically by file name (a mismatch warns, does not fail)

    @property
    def compared(self) -> bool:
        """Whether anything was compared: with nothing pinned (or computable), "ok" would mean nothing."""
        return any(c.ok is not None for c in self.checks)


def _registry_files(pair: ModelPair) -> list[ModelFile]:
    files = [pair.target] + ([pair.mmproj] if pair.mmproj is not None else []) + list(pair.drafts.values())
    return files


def _matches(mf: ModelFile, basename: str) -> bool:
    if mf.filename:
        return mf.filename.rsplit("/", 1)[-1] == basename
    return bool(mf.glob) and fnmatch.fnmatchcase(basename, mf.glob.rsplit("/", 1)[-1])


def find_expected(name: str, basename: str, file_sha256: str | None = None) -> ModelFile:
    """The ModelFile of pair ``name`` (``name:key`` picks a role or draft key) that this file should be."""
    pair_name, _, key = name.partition(":")
    pair = registry.load_registry().get(pair_name)
    files = _registry_files(pair)
    if key:
        chosen = [f for f in files if f.key == key or f.role == key]
        if not chosen:
            raise UsageError(
                f"{pair_name} has no file '{printable(key, 40)}' (keys: {', '.join(sorted({f.key for f in files}))})"
            )
        return chosen[0]
    by_name = [f for f in files if _matches(f, basename)]
    if by_name:
        return by_name[0]
    by_hash = [f for f in files if file_sha256 and f.sha256 == file_sha256]
    if by_hash:
        return by_hash[0]
    raise UsageError(
        f"{printable(basename, 80)} matches none of {pair_name}'s files; name one with "
        f"--expect {pair_name}:KEY ({', '.join(sorted({f.key for f in files}))})"
    )


def auto_expected(basename: str, file_sha256: str | None = None) -> tuple[str, ModelFile] | None:
    """(pair name, ModelFile) pinning this exact file name (or, when hashed, this sha256); None otherwise."""
    try:
        reg = registry.load_registry()
    except DsparkError:
        return None  # advisory only: a broken user models.toml is reported by the commands that need it
    candidates = [(pair.name, mf) for pair in reg.pairs.values() for mf in _registry_files(pair)]
    for name, mf in candidates:
        if mf.filename and mf.filename.rsplit("/", 1)[-1] == basename and (mf.size or mf.sha256 or mf.census):
            return name, mf
    for name, mf in candidates:
        if file_sha256 and mf.sha256 == file_sha256:
            return name, mf
    return None


def check_expected(
    h: GGUFHeader, model_file: ModelFile, model: str, file_sha256: str | None, explicit: bool = True
) -> ExpectVerdict:
    counts = census(h).counts()
    checks = [
        ExpectCheck(
            "size", None if model_file.size is None else model_file.size == h.file_size, model_file.size, h.file_size
        ),
        ExpectCheck(
            "census",
            None if not model_file.census else dict(model_file.census) == counts,
            dict(model_file.census) or None,
            counts,
        ),
        ExpectCheck(
            "sha256",
            None if model_file.sha256 is None or file_sha256 is None else model_file.sha256 == file_sha256,
            model_file.sha256,
            file_sha256,
        ),
    ]
    ok = all(c.ok is not False for c in checks) and any(c.ok is not None for c in checks)
    return ExpectVerdict(
        model=model,
        role=model_file.role,
        key=model_file.key,
        pinned_file=model_file.pattern,
        ok=ok,
        checks=tuple(checks),
        explicit=explicit,
    )


# ------------------------------------------------------------------ the whole inspect job


@dataclass(frozen=True)
class FileReport:
    spec: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    n_kv: int
    summary: MetadataSummary
    census: Census
    structure: DSparkStructure | None
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    file_sha256: str | None = None
    tensor_sha256: dict[str, str] | None = field(default=None, repr=False)
    hash_mb_per_s: float | None = None
    memory: MemoryEstimate | None = None
    expect: ExpectVerdict | None = None
    mmproj_width: str | None = None  # mmproj only: the width it feeds the text model, and from where
    devices: tuple[DeviceShare, ...] | None = None  # -c with --tensor-split: weights + KV on each device
    engine: tuple[PairCheck, ...] = ()  # can the engine in use load it (arch / projector, tensor types)


@dataclass(frozen=True)
class InspectReport:
    files: tuple[FileReport, ...]
    pairing: PairVerdict | None
    diff: TensorDiff | None
    memory_total: int | None = (
        None  # -c with several files: all weights + every KV cache (the draft's n_ctx = the target's)
    )
    devices_total: tuple[DeviceShare, ...] | None = None  # --tensor-split: every file's share, per device


HashProgress = Callable[[str, int], Callable[[int], None]]  # (name, total bytes) -> per-chunk callback


def _hash(h: GGUFHeader, progress: HashProgress | None) -> FileHashes:
    if h.name.startswith("hf://"):
        raise UsageError(f"{h.name}: --hash and --against need a local file (remote reads stop at the header)")
    cb = progress(h.name, h.file_size) if progress else None
    return hash_file(h.name, h, cb)


def _mmproj_width_text(h: GGUFHeader) -> str | None:
    if role_of(h) != "mmproj":
        return None
    width, how = mmproj_width(h)
    return f"width {width} from {how}" if width is not None else how


def _roles(headers: Sequence[GGUFHeader]) -> dict[str, list[GGUFHeader]]:
    roles: dict[str, list[GGUFHeader]] = {"target": [], "draft": [], "mmproj": []}
    for h in headers:
        roles[role_of(h)].append(h)
    return roles


def inspect_files(
    specs: Sequence[str],
    *,
    do_hash: bool = False,
    against: str | None = None,
    expect: str | None = None,
    auto_expect: bool = True,
    ctx: int | None = None,
    kv_type: str = "f16",
    progress: HashProgress | None = None,
    endpoint: str | None = None,
    tensor_split: tuple[float, ...] = (),
    draft_device: int | None = None,
    tables: EngineTables | None = None,
) -> InspectReport:
    if not specs:
        raise UsageError("give at least one GGUF file")
    if ctx is not None and ctx < 1:
        raise UsageError(f"-c must be at least 1 (got {ctx})")
    if kv_type not in KV_TYPE_BYTES:
        raise UsageError(f"unknown KV cache type '{printable(kv_type, 20)}' (one of {', '.join(KV_TYPE_BYTES)})")
    if tensor_split and not ctx:
        raise UsageError("--tensor-split splits the memory estimate: give -c CTX too")
    if draft_device is not None and not tensor_split:  # it names one device of the split: none without one
        raise UsageError("--draft-device needs --tensor-split (it names one of the split's devices)")
    if draft_device is not None and not 0 <= draft_device < len(tensor_split):
        raise UsageError(
            f"--draft-device {draft_device} is not one of the {len(tensor_split)} devices of --tensor-split"
        )
    headers = [read_gguf(s, endpoint=endpoint) for s in specs]
    other = read_gguf(against, endpoint=endpoint) if against else None
    if against and len(headers) != 1:
        raise UsageError("--against compares one FILE with OTHER; give exactly one FILE")
    hashes: dict[int, FileHashes] = {}
    need_hash = do_hash or other is not None
    reports = []
    for i, h in enumerate(headers):
        model_file, model_name = None, ""
        if expect:
            model_file, model_name = find_expected(expect, Path(h.name).name), expect.partition(":")[0]
        # an explicit --expect with a pinned sha256 hashes the file; the automatic match never does (targets are GBs)
        pinned_sha = bool(expect) and model_file is not None and model_file.sha256 and not h.name.startswith("hf://")
        if need_hash or pinned_sha:
            hashes[i] = _hash(h, progress)
        fh = hashes.get(i)
        file_sha = fh.file_sha256 if fh else h.remote_sha256
        if not expect and auto_expect:
            found = auto_expected(Path(h.name).name, file_sha)
            if found is not None:
                model_name, model_file = found
        verdict = check_expected(h, model_file, model_name, file_sha, explicit=bool(expect)) if model_file else None
        reports.append(
            FileReport(
                spec=specs[i],
                file_size=h.file_size,
                version=h.version,
                alignment=h.alignment,
                data_offset=h.data_offset,
                n_kv=len(h.kv),
                summary=summarize(h),
                census=census(h),
                structure=dspark_structure(h),
                metadata=metadata_json(h),
                tensors=h.tensors,
                file_sha256=fh.file_sha256 if fh else None,
                tensor_sha256=fh.tensors if fh else None,
                hash_mb_per_s=(fh.n_bytes / fh.seconds / 1e6) if fh and fh.seconds > 0 else None,
                memory=memory_estimate(h, ctx, kv_type) if ctx else None,
                expect=verdict,
                mmproj_width=_mmproj_width_text(h),
                engine=check_loads(h, tables) if tables is not None else (),
                devices=_devices(h, ctx, kv_type, tensor_split, draft_device) if tensor_split and ctx else None,
            )
        )
    diff = None
    if other is not None:
        diff = diff_tensors(headers[0], hashes[0], other, _hash(other, progress))
    roles = _roles(headers)
    pairing = None
    # exactly one target with one draft and/or one mmproj is a pair; anything else is a list of files
    n_target, n_draft, n_mmproj = len(roles["target"]), len(roles["draft"]), len(roles["mmproj"])
    if n_target == 1 and n_draft <= 1 and n_mmproj <= 1 and n_draft + n_mmproj >= 1:
        pairing = check_pair(
            roles["target"][0], roles["draft"][0] if n_draft else None, roles["mmproj"][0] if n_mmproj else None
        )
    memory_total = sum(f.memory.total_bytes for f in reports if f.memory) if ctx and len(reports) > 1 else None
    return InspectReport(
        files=tuple(reports),
        pairing=pairing,
        diff=diff,
        memory_total=memory_total,
        devices_total=_sum_devices([f.devices for f in reports if f.devices]) if tensor_split else None,
    )


def _devices(
    h: GGUFHeader, ctx: int, kv_type: str, split: tuple[float, ...], draft_device: int | None
) -> tuple[DeviceShare, ...] | None:
    """Where llama.cpp's layer split puts this file's weights and KV cache (mmproj: not split, None).
    A draft follows the target's split unless ``draft_device`` names one device (``-devd``)."""
    role = role_of(h)
    if role == "mmproj":
        return None
    lb = layer_bytes(h, kv_type)
    fractions = split
    if role == "draft" and draft_device is not None:
        fractions = tuple(1.0 if i == draft_device else 0.0 for i in range(len(split)))
    return device_bytes(lb.layers, lb.input_bytes, lb.output_bytes, [k * ctx for k in lb.kv_per_token], fractions)


def _sum_devices(per_file: Sequence[tuple[DeviceShare, ...]]) -> tuple[DeviceShare, ...]:
    names = [d.device for d in per_file[0]] if per_file else []
    return tuple(
        DeviceShare(n, sum(f[i].weights_bytes for f in per_file), sum(f[i].kv_bytes for f in per_file), ())
        for i, n in enumerate(names)
    )
