"""Where a decoding step's milliseconds go (issue 19): Nsight Compute's CSV -> kernel records -> a table.

Pure and stdlib-only (study/gpu_profile.py runs the servers; study/profile_to_md.py renders). The input
is ncu's documented CSV ("details" page, one row per kernel x metric: "ID", ..., "Kernel Name", ...,
"Metric Name", "Metric Unit", "Metric Value"), profiled over a bounded window of kernel launches
(``--launch-skip S --launch-count M``) taken in the middle of a long greedy generation.

ncu does not know where a step begins. Decoding at a fixed budget launches the same kernel sequence every
step (the draft's graph, then the target's verify graph), so the window's kernel-name sequence is periodic;
its period P is the kernels per step and the window holds len/P steps. A window that is not periodic (it
straddles the prompt, the end of the generation, or steps that launch different kernels) is reported as
such (``period`` None), never divided by a guessed step count.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Kinds, in table order. "moe": the expert routing/gather kernels around mul_mat_id; the expert matmuls
# themselves run in mul_mat_q / mul_mat_vec_q (mul_mat_vec_q_moe for 2-8 tokens) with an ids argument, so
# they count as "matmul" (the table says so).
KINDS = ("matmul", "moe", "flash_attn", "norm", "rope", "elementwise", "copy", "sampling", "recurrent", "other")
KIND_LABELS = {
    "matmul": "matmul (MMQ/MMVQ/cuBLAS)",
    "moe": "mul_mat_id (MoE routing)",
    "flash_attn": "flash attn",
    "norm": "norm/softmax",
    "rope": "rope",
    "elementwise": "elementwise/glu",
    "copy": "get_rows/cpy/concat",
    "sampling": "argmax/top-k",
    "recurrent": "ssm/delta-net",
    "other": "other",
}

# First match wins: the more specific patterns come first ("topk_moe" before "top_k", "mul_mat_id" before
# "mul_mat"). Matched against the kernel's base name (no "void ", template arguments or parameters).
_RULES: tuple[tuple[str, str], ...] = (
    # not a bare "moe": mul_mat_vec_q_moe is the expert product itself (MMVQ with ids, batches of 2-8)
    (
        "moe",
        r"mul_mat_id|mm_ids_helper|topk_moe|moe_weighted_reduction|k_copy_src1_to_contiguous|"
        r"k_copy_dst_from_contiguous",
    ),
    ("recurrent", r"ssm_conv|ssm_scan|gated_delta|delta_net|rwkv|wkv|gla_f32|conv1d"),
    ("flash_attn", r"flash_attn|fattn"),
    ("sampling", r"argmax|argsort|top_k|topk|cumsum|sampl"),
    ("matmul", r"mul_mat|quantize_q8_1|quantize_mmq|gemm|gemv|nvjet|cutlass|xmma|cublas|mmq|mmvq|mmf|dot_"),
    ("norm", r"norm|soft_max|softmax"),
    ("rope", r"rope"),
    ("copy", r"get_rows|set_rows|cpy|copy|concat|dup|transpose|convert|dequantize|repeat|pad|k_set\b"),
    (
        "elementwise",
        r"bin_bcast|unary|glu|silu|gelu|relu|sigmoid|softplus|swiglu|geglu|scale|clamp|add|mul|sub|"
        r"div|sqr|sqrt|exp|tanh|neg|step|fill|sum_rows|sum|mean",
    ),
)
_COMPILED = tuple((kind, re.compile(pat)) for kind, pat in _RULES)

# ncu's time units (with --print-units base every duration is in nsecond; the others are accepted anyway)
_NS_PER = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
TIME_METRIC = "gpu__time_duration.sum"


def base_name(kernel_name: str) -> str:
    """``void mul_mat_vec_q<(ggml_type)12, 1>(const void*, ...)`` -> ``mul_mat_vec_q``."""
    name = kernel_name.strip()
    if name.startswith("void "):
        name = name[5:]
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    return name.rsplit("::", 1)[-1] if "::" in name and not name.startswith("cutlass") else name


def classify(kernel_name: str) -> str:
    """The kind of a CUDA kernel by its name (one of KINDS)."""
    base = base_name(kernel_name).lower()
    for kind, pat in _COMPILED:
        if pat.search(base):
            return kind
    return "other"


@dataclass(frozen=True)
class Kernel:
    """One profiled kernel launch: ncu's ID (launch order within the profile), its name and GPU time."""

    id: int
    name: str
    ns: float

    @property
    def kind(self) -> str:
        return classify(self.name)

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "ns": self.ns}


def parse_ncu_csv(text: str, metric: str = TIME_METRIC) -> list[Kernel]:
    """ncu --csv (details page) -> one Kernel per ID with ``metric`` (a duration), in ID order.

    Lines before the header (``==PROF==`` messages, the application's own output when ncu shares its
    stdout) are skipped; the header is the first line whose first field is ``ID``. A value may carry
    thousands separators ("1,234"). Raises ValueError without a header or on a duration in an unknown unit.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith(('"ID"', "ID,"))), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the input')
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    out: dict[int, Kernel] = {}
    for row in rows:
        if row.get("Metric Name") != metric or not (row.get("ID") or "").strip().isdigit():
            continue
        unit = (row.get("Metric Unit") or "nsecond").strip()
        if unit not in _NS_PER:
            raise ValueError(f"unknown time unit {unit!r} for {metric} (profile with --print-units base)")
        value = float((row.get("Metric Value") or "").replace(",", ""))
        kid = int(row["ID"])
        out[kid] = Kernel(id=kid, name=row.get("Kernel Name", ""), ns=value * _NS_PER[unit])
    return [out[k] for k in sorted(out)]


def kernels_record(kernels: Sequence[Kernel]) -> dict[str, Any]:
    """Kernels as JSON that stays small (thousands of launches of a few dozen demangled names): the
    distinct names and their kinds once, then one [id, name index, ns] per launch."""
    names: dict[str, int] = {}
    launches = [[k.id, names.setdefault(k.name, len(names)), k.ns] for k in kernels]
    return {"names": list(names), "kinds": [classify(n) for n in names], "kernels": launches}


def kernels_from_record(rec: Mapping[str, Any]) -> list[Kernel]:
    names = rec["names"]
    return [Kernel(id=int(i), name=str(names[int(n)]), ns=float(ns)) for i, n, ns in rec["kernels"]]


def find_period(names: Sequence[str], *, min_match: float = 1.0, min_repeats: int = 2) -> int | None:
    """The step period of a window of kernel names: the smallest P with names[i] == names[i + P] for every
    i, seen ``min_repeats`` times (len >= min_repeats * P); None when there is none.

    ``min_match`` < 1, when no exact period exists: of the P with names[i] == names[i + P] for at least that
    share of i, the best-matching one P* (a multiple of the step can match better than the step itself in a
    short window: an odd launch near the window's end is compared once instead of twice), then the smallest
    passing P that divides P*. A layer's period may pass a low ``min_match`` too (every layer launches the
    same kernels) and divide P* by chance: the table prints kernels per step to check against."""
    exact = _periods(names, 1.0, min_repeats, first=True)
    if exact or min_match >= 1.0:
        return exact[0][0] if exact else None
    passing = _periods(names, min_match, min_repeats, first=False)
    if not passing:
        return None
    best = max(passing, key=lambda pr: (pr[1], -pr[0]))[0]
    return min(p for p, _ in passing if best % p == 0)


def _periods(names: Sequence[str], min_match: float, min_repeats: int, *, first: bool) -> list[tuple[int, float]]:
    """(P, share of i with names[i] == names[i + P]) for each P that reaches ``min_match``; only the
    smallest with ``first``."""
    n, found = len(names), []
    for p in range(1, n // min_repeats + 1):
        pairs = n - p
        allowed = int((1.0 - min_match) * pairs + 1e-9)  # misses <= (1 - min_match) * pairs
        misses = 0
        for i in range(pairs):
            if names[i] != names[i + p]:
                misses += 1
                if misses > allowed:
                    break
        else:
            found.append((p, 1.0 - misses / pairs))
            if first:
                break
    return found


@dataclass(frozen=True)
class StepProfile:
    """A window of kernels read as whole steps: kernel ms per step by kind."""

    kernels: int  # in the window
    period: int | None  # kernels per step; None: the window is not periodic
    steps: float | None  # steps in the window (kernels / period)
    total_ms: float  # GPU time of the window's kernels
    by_kind_ms: dict[str, float]  # per step (per window when not periodic)

    @property
    def kernel_ms_per_step(self) -> float | None:
        return self.total_ms / self.steps if self.steps else None


def step_profile(kernels: Sequence[Kernel], *, min_match: float = 1.0) -> StepProfile:
    """Kernel time per step, by kind. The window is cut to whole periods (any P consecutive launches of a
    periodic sequence are one step, rotated), so the per-step sums are exact sums over launches."""
    period = find_period([k.name for k in kernels], min_match=min_match)
    used = kernels[: (len(kernels) // period) * period] if period else kernels
    steps = len(used) / period if period else None
    by_kind = {kind: 0.0 for kind in KINDS}
    for k in used:
        by_kind[k.kind] += k.ns / 1e6
    if steps:
        by_kind = {kind: ms / steps for kind, ms in by_kind.items()}
    return StepProfile(
        kernels=len(kernels), period=period, steps=steps, total_ms=sum(k.ns for k in used) / 1e6, by_kind_ms=by_kind
    )


def server_step(timings: Mapping[str, Any], spec_steps: int) -> dict[str, Any]:
    """llama-server's own numbers for one request: the step time and tokens per step.

    A drafting request's steps are its verification steps (/metrics' drafts counter moved by the request);
    plain decoding's steps are its generated tokens. Like BENCHMARKS.md's t_step: predicted_ms / steps.
    """
    predicted_n, predicted_ms = int(timings["predicted_n"]), float(timings["predicted_ms"])
    steps = spec_steps if spec_steps else predicted_n
    return {
        "prompt_n": int(timings.get("prompt_n", 0)),
        "prompt_ms": float(timings.get("prompt_ms", 0.0)),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "draft_n": int(timings.get("draft_n", 0)),
        "draft_n_accepted": int(timings.get("draft_n_accepted", 0)),
        "steps": steps,
        "t_step_ms": predicted_ms / steps if steps else None,
        "tokens_per_step": predicted_n / steps if steps else None,
        "ms_per_token": predicted_ms / predicted_n if predicted_n else None,
    }


def median_timing(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The timed request of median step time (the lower middle of an even count): one real request's
    numbers, so t_step, tokens per step and the draft time stay consistent with each other."""
    ranked = sorted(records, key=lambda r: (r.get("t_step_ms") is None, r.get("t_step_ms") or 0.0))
    return ranked[(len(ranked) - 1) // 2]


def breakdown_row(config: str, server: Mapping[str, Any] | None, prof: StepProfile | None) -> dict[str, Any]:
    """One row of "where a step's milliseconds go": llama-server's step time, the kernels' share by kind,
    the rest (host work: sampling, scheduling, graph build/launch, and GPU idle at syncs), per token."""
    t_step = server.get("t_step_ms") if server else None
    tps = server.get("tokens_per_step") if server else None
    kernel = prof.kernel_ms_per_step if prof else None
    row: dict[str, Any] = {
        "config": config,
        "t_step_ms": t_step,
        "tokens_per_step": tps,
        "t_draft_ms": server.get("t_draft_ms") if server else None,
        "kernel_ms": kernel,
        "kernels_per_step": prof.period if prof else None,
        "by_kind_ms": dict(prof.by_kind_ms) if prof and prof.steps else None,
        "gap_ms": t_step - kernel if t_step is not None and kernel is not None else None,
    }
    row["ms_per_token"] = t_step / tps if t_step is not None and tps else None
    row["kernel_ms_per_token"] = kernel / tps if kernel is not None and tps else None
    return row


def rows_from_records(records: Iterable[Mapping[str, Any]], *, min_match: float = 1.0) -> list[dict[str, Any]]:
    """gpu_profile.py's JSONL (``timing`` and ``kernels`` records) -> breakdown rows, in the order the
    configurations first appear: the median timed request (median_timing) against the kernel window; a
    configuration without a kernel profile keeps its server timings. ``min_match`` < 1 reads a window
    whose steps differ in a few launches (accepted drafts roll the recurrent state back differently) as
    periodic all the same (find_period)."""
    order: list[str] = []
    timings: dict[str, list[Mapping[str, Any]]] = {}
    kernels: dict[str, list[Kernel]] = {}
    for r in records:
        cfg = r.get("config")
        if r.get("record") not in ("timing", "kernels") or not isinstance(cfg, str):
            continue
        if cfg not in order:
            order.append(cfg)
        if r["record"] == "timing":
            timings.setdefault(cfg, []).append(r)
        else:
            kernels[cfg] = kernels_from_record(r)
    return [
        breakdown_row(
            c,
            median_timing(timings[c]) if c in timings else None,
            step_profile(kernels[c], min_match=min_match) if c in kernels else None,
        )
        for c in order
    ]
