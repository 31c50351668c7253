"""`dspark requant`: change the type of a few tensors (the DSpark heads) and prove nothing else moved.

The recipe is seed 001's, made safe (llama.cpp 0c1e570, tools/quantize/quantize.cpp + src/llama-quant.cpp):

* A per-tensor type map pins every tensor to its current type and sends ``markov_w1``, ``markov_w2`` and
  ``fc`` to the heads type. Each line is an anchored, escaped regex (``^fc\\.weight$=q8_0``) because
  llama-quantize lowercases every pattern and ``std::regex_search``-es it, first match wins: a bare
  ``fc.weight`` would also match ``xfc.weight`` or ``fc_weight``.
* The positional type must be a *quantised* one (we pass the heads type, or Q8_0 for float heads): the
  map is only consulted when the positional type's base type is quantised, so ``COPY`` (and ``F32``,
  ``F16``, ``BF16``) silently ignore it. ``BF16`` is worse than ignoring: every 2-D weight becomes BF16.
* No ``--allow-requantize``: a pinned tensor's type equals its target, so it is copied verbatim; the flag
  is only needed to move an already-quantised tensor to another type, and we ask for it explicitly.
* llama-quantize never converts 1-D tensors (``conf_proj.weight`` {E+R, 1} counts as 1-D), ``*_norm.weight``,
  names not ending in ``weight`` and a list of special names; a row length that is not a multiple of the
  target block silently falls back (Q6_K -> Q8_0 -> F16). Both are refused here before anything runs.
* On failure llama-quantize leaves its partial output behind; we write to a temp file next to OUT and
  rename only after the per-tensor sha256 verification passed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparkcli.errors import DsparkError, UsageError, VerificationError
from dsparkcli.gguf import reader
from dsparkcli.gguf.analysis import Census, census
from dsparkcli.gguf.hashes import (
    FileHashes,
    diff_tensors,  # the same comparison rule as `dspark inspect --against`
    hash_file,
)
from dsparkcli.gguf.reader import GGUFHeader, TensorInfo
from dsparkcli.outputs import check_output_file
from dsparkcli.quantize_rules import (
    IGNORING_FTYPES,
    QUANTISED_FTYPES,
    block_of,
    canonical_type,
    fallback_type,
    known_type,
    map_pattern,
    never_quantised_reason,
    squeeze,
    type_id,
)

HEAD_TENSORS = ("markov_w1.weight", "markov_w2.weight", "fc.weight")
HEAD_TYPES = ("q8_0", "q6_K", "bf16")
DEFAULT_POSITIONAL = "Q8_0"
# Keys llama-quantize sets on every output; any other metadata change is a verification failure.
KV_SET_BY_QUANTIZE = ("general.file_type", "general.quantization_version")
PARTIAL_SUFFIX = ".dspark-partial"
MAP_SUFFIX = ".dspark-types.txt"


class QuantizeError(DsparkError):
    """llama-quantize exited non-zero; ``log_tail`` holds the end of its output."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint=hint)
        self.log_tail = log_tail


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # ggml ne order
    current: str
    target: str
    bytes_before: int
    bytes_after: int
    why: str  # "head" | "--tensor" | "pinned"

    @property
    def changes(self) -> bool:
        return self.current != self.target


@dataclass(frozen=True)
class Plan:
    src: Path
    dst: Path
    positional: str  # llama-quantize's positional file type
    allow_requantize: bool
    tensors: tuple[TensorPlan, ...]
    census_before: Census
    census_after: Census  # predicted; file_size is the input's
    map_path: Path  # written next to OUT while llama-quantize runs, then removed
    partial_path: Path  # llama-quantize's output, renamed to dst once verified
    command: tuple[str, ...]

    @property
    def changes(self) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.tensors if t.changes)

    @property
    def map_lines(self) -> tuple[str, ...]:
        return type_map_lines(self.tensors)

    @property
    def predicted_tensor_bytes(self) -> int:
        return sum(t.bytes_after for t in self.tensors)


def type_map_lines(tensors: Sequence[TensorPlan]) -> tuple[str, ...]:
    """The --tensor-type-file content: one ``^name$=type`` line per tensor, whitespace-separated."""
    return tuple(f"{map_pattern(t.name)}={t.target.lower()}" for t in tensors)


def parse_overrides(specs: Sequence[str]) -> dict[str, str]:
    """``NAME=TYPE`` strings (``--tensor``) -> {name: canonical type}."""
    found: dict[str, str] = {}
    for spec in specs:
        name, sep, qtype = spec.partition("=")
        name = name.strip()
        if not sep or not name or not qtype.strip():
            raise UsageError(f"--tensor takes NAME=TYPE (e.g. markov_w1.weight=q8_0), got {spec!r}")
        if name in found:
            raise UsageError(f"--tensor names {name!r} twice")
        found[name] = canonical_type(qtype)
    return found


def _pinnable(t: TensorInfo, src: str) -> None:
    if t.n_bytes is None or not known_type(t.type_name):
        raise UsageError(f"{src}: tensor {t.name!r} has type {t.type_name}, unknown to dspark; cannot pin it")
    if t.name != t.name.lower() or any(c.isspace() for c in t.name):
        # llama-quantize lowercases patterns and splits the map file on whitespace
        raise UsageError(
            f"{src}: tensor name {t.name!r} has upper-case letters or spaces; "
            "llama-quantize's --tensor-type-file cannot pin it"
        )


def _check_change(t: TensorInfo, target: str, allow_requantize: bool, src: str) -> None:
    reason = never_quantised_reason(t.name, t.shape)
    if reason is not None:
        raise UsageError(
            f"{t.name} {list(t.shape)} stays {t.type_name}: llama-quantize keeps {reason} in their "
            f"stored type, so it cannot become {target}"
        )
    fallback = fallback_type(target, t.shape[0])
    if fallback is not None:
        raise UsageError(
            f"{t.name}: rows of {t.shape[0]} values are not a multiple of the {target} block "
            f"({block_of(target)[0]}); llama-quantize would silently write {fallback} instead"
        )
    current_id = t.type_id
    if current_id not in (0, 1, 30) and not allow_requantize:  # F32, F16, BF16 are not quantised
        raise UsageError(
            f"{t.name} is already {t.type_name}: making it {target} requantises quantised data "
            "(pass --allow-requantize if that is what you want)"
        )


def _paths(dst: Path) -> tuple[Path, Path]:
    return dst.with_name("." + dst.name + PARTIAL_SUFFIX), dst.with_name("." + dst.name + MAP_SUFFIX)


def quantize_command(
    quantize: str | os.PathLike[str], src: Path, partial: Path, map_path: Path, positional: str, allow_requantize: bool
) -> tuple[str, ...]:
    flags = ("--allow-requantize",) if allow_requantize else ()
    return (str(quantize), "--tensor-type-file", str(map_path), *flags, str(src), str(partial), positional)


def _head_type(heads: str) -> str:
    if heads.lower() not in {h.lower() for h in HEAD_TYPES}:
        raise UsageError(f"--heads must be one of {', '.join(HEAD_TYPES)}, got {heads!r}")
    return canonical_type(heads)


def plan_tensors(
    h: GGUFHeader,
    *,
    heads: str = "q8_0",
    overrides: Sequence[str] | dict[str, str] = (),
    allow_requantize: bool = False,
) -> tuple[TensorPlan, ...]:
    """Every tensor with its target type: pinned, head, or --tensor; refuses what llama-quantize would not do."""
    src = Path(h.name).name
    head_type = _head_type(heads)
    wanted = dict(overrides) if isinstance(overrides, dict) else parse_overrides(overrides)
    wanted = {k: canonical_type(v) for k, v in wanted.items()}
    by_name = h.tensor_map()
    for name in HEAD_TENSORS:
        if name not in by_name:
            raise UsageError(f"{src} has no tensor {name}: not a DSpark draft")
    for name in wanted:
        if name not in by_name:
            raise UsageError(f"--tensor {name}: no tensor of that name in {src}")
    plans: list[TensorPlan] = []
    for t in h.tensors:
        _pinnable(t, src)
        if t.name in wanted:
            target, why = wanted[t.name], "--tensor"
        elif t.name in HEAD_TENSORS:
            target, why = head_type, "head"
        else:
            target, why = t.type_name, "pinned"
        if target != t.type_name:
            _check_change(t, target, allow_requantize, src)
            block, size = block_of(target)
            after = t.n_elements // block * size
        else:
            after = t.n_bytes or 0
        plans.append(TensorPlan(t.name, t.shape, t.type_name, target, t.n_bytes or 0, after, why))
    if not any(p.changes for p in plans):
        raise UsageError(f"nothing to change: every tensor of {src} already has its planned type")
    return tuple(plans)


def build_plan(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    heads: str = "q8_0",
    overrides: Sequence[str] | dict[str, str] = (),
    allow_requantize: bool = False,
    positional: str | None = None,
    force: bool = False,
    quantize: str | os.PathLike[str] = "llama-quantize",
    header: GGUFHeader | None = None,
) -> Plan:
    """Check everything that can be checked before running llama-quantize, and say exactly what will happen."""
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.is_file():
        raise UsageError(f"input not found: {src_p}")
    check_output_file(dst_p, inputs=[src_p], replace=force)  # never a device, a folder or the input
    head_type = _head_type(heads)
    # the heads type names the file type when it can (general.file_type follows it); float heads need Q8_0
    positional = (positional or (head_type if head_type in QUANTISED_FTYPES else DEFAULT_POSITIONAL)).upper()
    if positional in IGNORING_FTYPES:
        raise UsageError(
            f"positional type {positional} makes llama-quantize ignore --tensor-type-file "
            f"(the map applies only on a quantised base type); use one of {', '.join(QUANTISED_FTYPES)}"
        )
    if positional not in QUANTISED_FTYPES:
        raise UsageError(f"unsupported positional type {positional}; use one of {', '.join(QUANTISED_FTYPES)}")
    h = header if header is not None else reader.read_header(src_p)
    plans = plan_tensors(h, heads=heads, overrides=overrides, allow_requantize=allow_requantize)
    predicted = dataclasses.replace(
        h,
        tensors=tuple(
            dataclasses.replace(t, type_id=type_id(p.target), type_name=p.target, n_bytes=p.bytes_after)
            for t, p in zip(h.tensors, plans)
        ),
    )
    partial, map_path = _paths(dst_p)
    return Plan(
        src=src_p,
        dst=dst_p,
        positional=positional,
        allow_requantize=allow_requantize,
        tensors=plans,
        census_before=census(h),
        census_after=census(predicted),
        map_path=map_path,
        partial_path=partial,
        command=quantize_command(quantize, src_p, partial, map_path, positional, allow_requantize),
    )


# ------------------------------------------------------------------ verification


@dataclass(frozen=True)
class Verification:
    changed: tuple[str, ...]  # as planned: new type, bytes as predicted
    identical: tuple[str, ...]  # same type, same data sha256
    respelled: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # identical, shape written differently
    kv_set: dict[str, Any]  # the keys llama-quantize set (general.file_type, ...)
    in_sha256: str
    out_sha256: str
    seconds: float


def verify(
    plan: Plan, before: GGUFHeader, before_hashes: FileHashes, after: GGUFHeader, after_hashes: FileHashes
) -> Verification:
    """Every planned tensor has its new type and size; every other data region is byte-identical.

    The per-tensor comparison is inspect's diff (sha256 of each data region); this adds what the plan expects.
    """
    diff = diff_tensors(before, before_hashes, after, after_hashes)
    problems: list[str] = []
    if diff.only_a:
        problems.append(f"missing in output: {', '.join(diff.only_a)}")
    if diff.only_b:
        problems.append(f"not in input: {', '.join(diff.only_b)}")
    same = set(diff.identical)
    moved = {c.name: c for c in diff.changed}
    changed, identical = [], []
    for p in plan.tensors:
        if p.name in same:
            if p.changes:  # e.g. positional COPY: llama-quantize exits 0 and copies the tensor untouched
                problems.append(f"{p.name} is {p.current}, planned {p.target}")
            else:
                identical.append(p.name)
            continue
        c = moved.get(p.name)
        if c is None:
            continue  # reported above as missing
        if squeeze(c.a_shape) != squeeze(c.b_shape):
            problems.append(f"{p.name} shape {list(c.a_shape)} became {list(c.b_shape)}")
        elif not p.changes:
            what = f"type {c.a_type} -> {c.b_type}" if c.a_type != c.b_type else "data"
            problems.append(f"{p.name} changed ({what}), planned to be copied verbatim")
        elif c.b_type != p.target:
            problems.append(f"{p.name} is {c.b_type}, planned {p.target}")
        elif c.b_bytes != p.bytes_after:
            problems.append(f"{p.name} has {c.b_bytes} bytes, planned {p.bytes_after}")
        else:
            changed.append(p.name)
    kv_changed = sorted(
        k
        for k in set(before.kv) | set(after.kv)
        if k not in KV_SET_BY_QUANTIZE and before.kv.get(k) != after.kv.get(k)
    )
    if kv_changed:
        problems.append(f"metadata changed: {', '.join(kv_changed[:5])}")
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise VerificationError(f"{after.name}: {'; '.join(problems[:3])}{more}")
    return Verification(
        changed=tuple(changed),
        identical=tuple(identical),
        respelled=tuple(diff.respelled),
        kv_set={k: after.kv.get(k) for k in KV_SET_BY_QUANTIZE if k in after.kv},
        in_sha256=before_hashes.file_sha256,
        out_sha256=after_hashes.file_sha256,
        seconds=before_hashes.seconds + after_hashes.seconds,
    )


# ------------------------------------------------------------------ running


@dataclass(frozen=True)
class RequantResult:
    plan: Plan
    census_before: Census
    census_after: Census  # read from the written file
    verification: Verification
    size_before: int
    size_after: int
    ratio: float  # size_after / size_before
    quantize_seconds: float
    log_tail: str


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _error_line(log: str) -> str:
    m = re.search(r"failed to quantize: (.+)", log)
    if m:
        return m.group(1).strip()
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def execute(plan: Plan, *, on_step: Callable[[str], None] | None = None) -> RequantResult:
    """Run llama-quantize as planned into a temp file, verify it, rename it to OUT. Nothing is left on failure."""
    step = on_step or (lambda _msg: None)
    done = False
    try:
        plan.map_path.write_text("\n".join(plan.map_lines) + "\n")
        step(
            f"llama-quantize: {len(plan.changes)} tensor(s) to change, {len(plan.tensors) - len(plan.changes)} pinned"
        )
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                list(plan.command),
                check=False,
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
            )
        except OSError as e:
            raise QuantizeError(f"cannot run {plan.command[0]}: {e.strerror or e}") from None
        seconds = time.perf_counter() - started
        log = proc.stdout + proc.stderr
        tail = "\n".join(log.splitlines()[-30:])
        if proc.returncode != 0:
            raise QuantizeError(f"llama-quantize failed (exit {proc.returncode}): {_error_line(log)}", log_tail=tail)
        step("hashing every tensor data region of input and output")
        before = reader.read_header(plan.src)
        after = reader.read_header(plan.partial_path)
        before_h = hash_file(plan.src, before)
        after_h = hash_file(plan.partial_path, after)
        verification = verify(plan, before, before_h, after, after_h)
        with open(plan.partial_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(plan.partial_path, plan.dst)
        done = True
    finally:
        _remove(plan.map_path)
        if not done:
            _remove(plan.partial_path)
    size_before, size_after = before.file_size, after.file_size
    return RequantResult(
        plan=plan,
        census_before=census(before),
        census_after=census(after),
        verification=verification,
        size_before=size_before,
        size_after=size_after,
        ratio=size_after / size_before if size_before else 0.0,
        quantize_seconds=seconds,
        log_tail=tail,
    )


def requant(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    quantize: str | os.PathLike[str],
    *,
    heads: str = "q8_0",
    overrides: Sequence[str] = (),
    allow_requantize: bool = False,
    force: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> RequantResult:
    """Plan, run and verify in one call (the library form of `dspark requant`)."""
    plan = build_plan(
        src, dst, heads=heads, overrides=overrides, allow_requantize=allow_requantize, force=force, quantize=quantize
    )
    return execute(plan, on_step=on_step)
