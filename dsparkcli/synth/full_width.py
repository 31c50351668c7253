"""Full-width synthetic pairs: random weights at a real model's shapes, for throughput work.

Nothing here knows a right answer: the weights are random, so acceptance must be emulated with
llama-server's ``--spec-synth-len``. What is real is every tensor shape, the quantised type and the
graph llama.cpp runs, so step costs, memory traffic and load times are those of the real pair.

The target for ``minicpm-v-4.7-35b-a3b`` is the MiniCPM-V-4.7-35B-A3B text tower written as arch
``qwen35moe`` (the arch its Qwen3.5-35B-A3B language model uses in llama.cpp: 40 layers, 3 of 4
gated-delta-net recurrent, MoE 256 experts x FF 512, 8 routed + 1 shared). ``qwen3moe`` (plain
attention, no shared expert) is offered as a stand-in to isolate the cost of recurrent checkpoints.

Files are written tensor by tensor from a pre-generated buffer of valid quantised blocks, hashed
while written, so a ~37 GB target needs a few MB of RAM and runs at disk speed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dsparkcli import __version__
from dsparkcli.errors import UsageError
from dsparkcli.outputs import check_output_dir, check_output_file

if TYPE_CHECKING:
    import numpy as np

SHAPES = ("minicpm-v-4.7-35b-a3b",)
TARGET_ARCHS = ("qwen35moe", "qwen3moe")
QTYPES = ("Q8_0", "Q4_K")

# bytes per block / weights per block of the raw quantised types we write
_QBLOCK = {"Q8_0": (34, 32), "Q4_K": (144, 256)}

ProgressFn = Callable[[int, int, str], None]  # (bytes done, bytes total, what)


@dataclass(frozen=True)
class TargetShape:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int  # partial rotary: 0.25 x head_dim for Qwen3.5
    rope_sections: tuple[int, int, int, int]
    rope_theta: float
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int  # 0: no shared expert
    vocab: int
    full_attention_interval: int  # qwen35moe: layers i with (i+1) % interval == 0 are full attention
    ssm_conv_kernel: int
    ssm_state: int  # head dim of the linear-attention K/V heads
    ssm_groups: int  # linear-attention K heads
    ssm_v_heads: int  # linear-attention V heads (= time_step_rank)
    ctx: int


@dataclass(frozen=True)
class DraftShape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: int
    block_size: int
    mask_token_id: int
    target_layers: tuple[int, ...]  # GGUF convention: HF layer id + 1 (input of that layer)
    markov_rank: int
    confidence_head: bool
    rope_theta: float
    ctx: int


@dataclass(frozen=True)
class FullWidthPair:
    target: Path
    draft: Path
    manifest: Path


def read_manifest(path: Path | str) -> FullWidthPair:
    """A written pair's files, from its manifest (file names relative to the manifest's folder)."""
    m, d = json.loads(Path(path).read_text(encoding="utf-8")), Path(path).parent
    return FullWidthPair(target=d / m["target"]["file"], draft=d / m["draft"]["file"], manifest=Path(path))


def measurement_pair(manifest: Path | str | None) -> FullWidthPair:
    """``manifest``'s pair (the H200 stand-in), else a 5 %-width qwen35moe one (~70 MB) beside the temp files."""
    return (
        read_manifest(manifest)
        if manifest
        else write_full_width(
            Path(tempfile.gettempdir()) / "dspark-hybrid-step-pair", scale=0.05, target_arch="qwen35moe"
        )
    )


# The real pair's numbers (upstream_facts.md; Qwen3.5-35B-A3B text tower for the target).
_REAL_TARGET = TargetShape(
    arch="qwen35moe",
    n_layer=40,
    n_embd=2048,
    n_head=16,
    n_head_kv=2,
    head_dim=256,
    rope_dim=64,
    rope_sections=(11, 11, 10, 0),
    rope_theta=10_000_000.0,
    n_expert=256,
    n_expert_used=8,
    n_ff_exp=512,
    n_ff_shexp=512,
    vocab=248_144,
    full_attention_interval=4,
    ssm_conv_kernel=4,
    ssm_state=128,
    ssm_groups=16,
    ssm_v_heads=32,
    ctx=262_144,
)
_REAL_TAPS_HF = (3, 11, 19, 27, 35)
_REAL_DRAFT = DraftShape(
    n_layer=5,
    n_embd=2048,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    n_ff=6144,
    vocab=248_144,
    block_size=15,
    mask_token_id=248_076,
    target_layers=tuple(h + 1 for h in _REAL_TAPS_HF),
    markov_rank=256,
    confidence_head=True,
    rope_theta=10_000_000.0,
    ctx=262_144,
)

ARCH_REASON = {
    "qwen35moe": (
        "the real text tower's own llama.cpp arch (Qwen3.5-35B-A3B: hybrid gated-delta-net + "
        "full attention every 4th layer, 256 experts x FF 512, 8 routed + 1 shared); it fills "
        "t_layer_inp so DSpark taps work; being recurrent, speculative decoding uses state "
        "rollback/checkpoints exactly as the real model would"
    ),
    "qwen3moe": (
        "plain-attention stand-in with the same width, depth, experts and vocab (no shared "
        "expert, no recurrent layers); isolates the cost of the hybrid model's checkpoints"
    ),
}


def _round_up(x: float, m: int) -> int:
    return max(m, int(math.ceil(x / m)) * m)


def shapes_for(
    shape: str = "minicpm-v-4.7-35b-a3b", *, scale: float = 1.0, target_arch: str = "qwen35moe"
) -> tuple[TargetShape, DraftShape]:
    """The (target, draft) shapes, shrunk by ``scale`` for CPU tests while keeping the structure.

    ``scale`` shrinks depth, width, experts, expert FF and vocab; head counts and head dims stay
    (they fix the attention kernels), taps keep their relative depth, the mask id keeps its
    distance from the end of the vocab. Widths stay multiples of 256 so Q4_K rows fit.
    """
    if shape not in SHAPES:
        raise UsageError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if target_arch not in TARGET_ARCHS:
        raise UsageError(f"unknown target arch {target_arch!r}; choose one of {', '.join(TARGET_ARCHS)}")
    if not (0.0 < scale <= 1.0):
        raise UsageError(f"scale must be in (0, 1], got {scale}")
    t, d = _REAL_TARGET, _REAL_DRAFT
    if scale < 1.0:
        n_layer = max(8, int(round(t.n_layer * scale / 4)) * 4)
        n_embd = _round_up(t.n_embd * scale, 256)
        vocab = max(1024, int(round(t.vocab * scale)))
        t = replace(
            t,
            n_layer=n_layer,
            n_embd=n_embd,
            vocab=vocab,
            ctx=8192,
            n_expert=max(16, int(round(t.n_expert * scale))),
            n_ff_exp=_round_up(t.n_ff_exp * scale, 256),
            n_ff_shexp=_round_up(t.n_ff_shexp * scale, 256),
        )
        taps = tuple(
            sorted({min(n_layer - 1, max(0, round((h + 1) * n_layer / _REAL_TARGET.n_layer))) for h in _REAL_TAPS_HF})
        )
        d = replace(
            d,
            n_embd=n_embd,
            vocab=vocab,
            mask_token_id=vocab - (_REAL_DRAFT.vocab - _REAL_DRAFT.mask_token_id),
            n_ff=_round_up(d.n_ff * scale, 256),
            target_layers=taps,
            ctx=8192,
        )
    if target_arch == "qwen3moe":
        # qwen3moe ropes the whole head and has no shared expert
        t = replace(
            t,
            arch="qwen3moe",
            rope_dim=t.head_dim,
            rope_sections=(0, 0, 0, 0),
            n_ff_shexp=0,
            full_attention_interval=1,
        )
    return t, d


# ------------------------------------------------------------------ tensor plans


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: str  # F32 | Q8_0 | Q4_K
    init: str  # ones | rand | ssm_a | dt_bias | conv
    role: str = "dense"  # dense | expert | embd (read one row per token) | draft

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        if self.qtype == "F32":
            return 4 * self.n_elements
        bsz, bw = _QBLOCK[self.qtype]
        return self.n_elements // bw * bsz


def _mat(name: str, ne: tuple[int, ...], qtype: str, role: str = "dense") -> TensorSpec:
    return TensorSpec(name, ne, qtype, "rand", role)


def _vec(name: str, n: int, init: str = "ones") -> TensorSpec:
    return TensorSpec(name, (n,), "F32", init)


def is_recurrent(t: TargetShape, il: int) -> bool:
    return t.arch == "qwen35moe" and (il + 1) % t.full_attention_interval != 0


def target_tensors(t: TargetShape, qtype: str) -> list[TensorSpec]:
    E, V, q = t.n_embd, t.vocab, qtype
    specs = [
        _mat("token_embd.weight", (E, V), q, "embd"),
        _vec("output_norm.weight", E),
        _mat("output.weight", (E, V), q),
    ]
    key_dim, value_dim = t.ssm_state * t.ssm_groups, t.ssm_state * t.ssm_v_heads
    for il in range(t.n_layer):
        b = f"blk.{il}."
        specs.append(_vec(b + "attn_norm.weight", E))
        if t.arch == "qwen35moe":
            specs.append(_vec(b + "post_attention_norm.weight", E))
        else:
            specs.append(_vec(b + "ffn_norm.weight", E))
        if is_recurrent(t, il):
            conv_dim = 2 * key_dim + value_dim
            specs += [
                _mat(b + "attn_qkv.weight", (E, conv_dim), q),
                _mat(b + "attn_gate.weight", (E, value_dim), q),
                TensorSpec(b + "ssm_conv1d.weight", (t.ssm_conv_kernel, conv_dim), "F32", "conv"),
                TensorSpec(b + "ssm_dt.bias", (t.ssm_v_heads,), "F32", "dt_bias"),
                TensorSpec(b + "ssm_a", (t.ssm_v_heads,), "F32", "ssm_a"),
                TensorSpec(b + "ssm_beta.weight", (E, t.ssm_v_heads), "F32", "rand"),
                TensorSpec(b + "ssm_alpha.weight", (E, t.ssm_v_heads), "F32", "rand"),
                _vec(b + "ssm_norm.weight", t.ssm_state),
                _mat(b + "ssm_out.weight", (value_dim, E), q),
            ]
        else:
            q_out = t.head_dim * t.n_head * (2 if t.arch == "qwen35moe" else 1)  # qwen35: query + gate
            kv = t.head_dim * t.n_head_kv
            specs += [
                _mat(b + "attn_q.weight", (E, q_out), q),
                _mat(b + "attn_k.weight", (E, kv), q),
                _mat(b + "attn_v.weight", (E, kv), q),
                _mat(b + "attn_output.weight", (t.head_dim * t.n_head, E), q),
                _vec(b + "attn_q_norm.weight", t.head_dim),
                _vec(b + "attn_k_norm.weight", t.head_dim),
            ]
        # the router stays F32 as in real quantised files; experts are the bulk of the file
        specs += [
            TensorSpec(b + "ffn_gate_inp.weight", (E, t.n_expert), "F32", "rand"),
            _mat(b + "ffn_gate_exps.weight", (E, t.n_ff_exp, t.n_expert), q, "expert"),
            _mat(b + "ffn_up_exps.weight", (E, t.n_ff_exp, t.n_expert), q, "expert"),
            _mat(b + "ffn_down_exps.weight", (t.n_ff_exp, E, t.n_expert), q, "expert"),
        ]
        if t.n_ff_shexp:
            specs += [
                TensorSpec(b + "ffn_gate_inp_shexp.weight", (E,), "F32", "rand"),
                _mat(b + "ffn_gate_shexp.weight", (E, t.n_ff_shexp), q),
                _mat(b + "ffn_up_shexp.weight", (E, t.n_ff_shexp), q),
                _mat(b + "ffn_down_shexp.weight", (t.n_ff_shexp, E), q),
            ]
    return specs


def draft_tensors(d: DraftShape, qtype: str) -> list[TensorSpec]:
    """The DSpark draft's tensors (no token_embd/output: shared with the target through ctx_other).

    Like the upstream Q8_0 GGUF, projections and the Markov head are quantised, norms and the
    confidence head F32.
    """
    E, q = d.n_embd, qtype
    specs = [
        _mat("fc.weight", (len(d.target_layers) * E, E), q),
        _vec("enc.output_norm.weight", E),
        _vec("output_norm.weight", E),
    ]
    for il in range(d.n_layer):
        b = f"blk.{il}."
        specs += [
            _vec(b + "attn_norm.weight", E),
            _mat(b + "attn_q.weight", (E, d.head_dim * d.n_head), q),
            _mat(b + "attn_k.weight", (E, d.head_dim * d.n_head_kv), q),
            _mat(b + "attn_v.weight", (E, d.head_dim * d.n_head_kv), q),
            _mat(b + "attn_output.weight", (d.head_dim * d.n_head, E), q),
            _vec(b + "attn_q_norm.weight", d.head_dim),
            _vec(b + "attn_k_norm.weight", d.head_dim),
            _vec(b + "ffn_norm.weight", E),
            _mat(b + "ffn_gate.weight", (E, d.n_ff), q),
            _mat(b + "ffn_up.weight", (E, d.n_ff), q),
            _mat(b + "ffn_down.weight", (d.n_ff, E), q),
        ]
    specs += [
        _mat("markov_w1.weight", (d.markov_rank, d.vocab), q),
        _mat("markov_w2.weight", (d.markov_rank, d.vocab), q),
    ]
    if d.confidence_head:
        specs += [
            TensorSpec("conf_proj.weight", (E + d.markov_rank,), "F32", "rand"),
            TensorSpec("conf_proj.bias", (1,), "F32", "dt_bias"),
        ]
    return specs


def _tokens(n: int) -> list[str]:
    # the "test" tokenizer only needs unique strings; it loads in milliseconds even at 248k entries
    return [f"<t{i}>" for i in range(n)]


def target_kv(t: TargetShape) -> list[tuple[str, str, object]]:
    a = t.arch
    kv: list[tuple[str, str, object]] = [
        ("general.architecture", "str", a),
        ("general.name", "str", f"dspark synthetic {a} (random weights)"),
        (f"{a}.context_length", "u32", t.ctx),
        (f"{a}.embedding_length", "u32", t.n_embd),
        (f"{a}.block_count", "u32", t.n_layer),
        (f"{a}.attention.head_count", "u32", t.n_head),
        (f"{a}.attention.head_count_kv", "u32", t.n_head_kv),
        (f"{a}.attention.key_length", "u32", t.head_dim),
        (f"{a}.attention.value_length", "u32", t.head_dim),
        (f"{a}.attention.layer_norm_rms_epsilon", "f32", 1e-6),
        (f"{a}.rope.freq_base", "f32", t.rope_theta),
        (f"{a}.rope.dimension_count", "u32", t.rope_dim),
        (f"{a}.expert_count", "u32", t.n_expert),
        (f"{a}.expert_used_count", "u32", t.n_expert_used),
        (f"{a}.expert_feed_forward_length", "u32", t.n_ff_exp),
        (f"{a}.feed_forward_length", "u32", t.n_ff_exp * t.n_expert_used),
    ]
    if a == "qwen35moe":
        kv += [
            (f"{a}.expert_shared_feed_forward_length", "u32", t.n_ff_shexp),
            (f"{a}.rope.dimension_sections", "i32[]", list(t.rope_sections)),
            (f"{a}.full_attention_interval", "u32", t.full_attention_interval),
            (f"{a}.ssm.conv_kernel", "u32", t.ssm_conv_kernel),
            (f"{a}.ssm.inner_size", "u32", t.ssm_state * t.ssm_v_heads),
            (f"{a}.ssm.state_size", "u32", t.ssm_state),
            (f"{a}.ssm.time_step_rank", "u32", t.ssm_v_heads),
            (f"{a}.ssm.group_count", "u32", t.ssm_groups),
        ]
    kv += [("tokenizer.ggml.model", "str", "test"), ("tokenizer.ggml.tokens", "str[]", _tokens(t.vocab))]
    return kv


def draft_kv(d: DraftShape) -> list[tuple[str, str, object]]:
    a = "dflash"
    return [
        ("general.architecture", "str", a),
        ("general.name", "str", "dspark synthetic DSpark draft (random weights)"),
        (f"{a}.context_length", "u32", d.ctx),
        (f"{a}.embedding_length", "u32", d.n_embd),
        (f"{a}.block_count", "u32", d.n_layer),
        (f"{a}.feed_forward_length", "u32", d.n_ff),
        (f"{a}.attention.head_count", "u32", d.n_head),
        (f"{a}.attention.head_count_kv", "u32", d.n_head_kv),
        (f"{a}.attention.key_length", "u32", d.head_dim),
        (f"{a}.attention.value_length", "u32", d.head_dim),
        (f"{a}.attention.layer_norm_rms_epsilon", "f32", 1e-6),
        (f"{a}.rope.freq_base", "f32", d.rope_theta),
        (f"{a}.target_layers", "i32[]", list(d.target_layers)),
        (f"{a}.block_size", "u32", d.block_size),
        (f"{a}.sample_from_anchor", "bool", True),
        (f"{a}.has_confidence_head", "bool", d.confidence_head),
        ("tokenizer.ggml.model", "str", "test"),
        ("tokenizer.ggml.tokens", "str[]", _tokens(d.vocab)),
        ("tokenizer.ggml.mask_token_id", "u32", d.mask_token_id),
    ]


# ------------------------------------------------------------------ data


_BUF_BLOCKS = 499_979  # a prime: repeats of the buffer never line up with rows or experts


def _quant_buffer(qtype: str, sigma: float, rng: np.random.Generator) -> bytes:
    """Valid blocks of ``qtype`` whose weights have mean 0 and std ``sigma``."""
    import numpy as np  # deferred: only writers need numpy

    n = _BUF_BLOCKS
    if qtype == "Q8_0":
        blocks = np.zeros(n, dtype=[("d", "<f2"), ("qs", "i1", 32)])
        blocks["qs"] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8)
        blocks["d"] = np.float16(sigma / 73.6)  # std of uniform int8 in [-127, 127]
        return blocks.tobytes()
    if qtype == "Q4_K":
        # scales bytes 0xA0 x 8 + 0x00 x 4 give sc = m = 32 in every sub-block; with dmin = 7.5 d
        # every weight is 32 d (q - 7.5): mean 0, std 147.5 d for uniform 4-bit q
        blocks = np.zeros(n, dtype=[("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
        d = sigma / 147.5
        blocks["d"], blocks["dmin"] = np.float16(d), np.float16(7.5 * d)
        blocks["scales"][:, :8] = 0xA0
        blocks["qs"] = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
        return blocks.tobytes()
    raise UsageError(f"unsupported qtype {qtype!r}; choose one of {', '.join(QTYPES)}")


def _f32_data(spec: TensorSpec, rng: np.random.Generator, sigma: float) -> bytes:
    import numpy as np  # deferred: only writers need numpy

    n = spec.n_elements
    if spec.init == "ones":
        x = np.ones(n, dtype=np.float32)
    elif spec.init == "ssm_a":  # -exp(A_log), A_log ~ log U(1, 8): decays in (0, 1)
        x = -rng.uniform(1.0, 8.0, n).astype(np.float32)
    elif spec.init == "dt_bias":
        x = rng.uniform(-4.0, -2.0, n).astype(np.float32)
    elif spec.init == "conv":
        x = rng.normal(0.0, 0.3, n).astype(np.float32)
    else:
        x = rng.normal(0.0, sigma, n).astype(np.float32)
    return x.tobytes()


def _sigma(spec: TensorSpec) -> float:
    # fan-in scaled so activations stay O(1) through 40 pre-norm residual layers; embeddings O(1)
    if spec.role == "embd":
        return 1.0
    return 0.5 / math.sqrt(spec.ne[0])


_ALIGN = 32
_CHUNK = 16 << 20


class _HashingWriter:
    """File writer that hashes in a worker thread (hashlib and file writes both release the GIL)."""

    def __init__(self, fout) -> None:  # type: ignore[no-untyped-def]
        self.fout = fout
        self.sha = hashlib.sha256()
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = None
        self.n = 0

    def write(self, data: bytes | memoryview) -> None:
        if self.pending is not None:
            self.pending.result()
        self.pending = self.pool.submit(self.sha.update, data)
        self.fout.write(data)
        self.n += len(data)

    def finish(self) -> str:
        if self.pending is not None:
            self.pending.result()
        self.pool.shutdown()
        return self.sha.hexdigest()


@dataclass(frozen=True)
class WriteStats:
    path: str
    bytes: int
    seconds: float
    sha256: str
    n_tensors: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


def write_gguf(
    path: Path,
    kv: list[tuple[str, str, object]],
    specs: list[TensorSpec],
    *,
    seed: int = 0,
    on_progress: ProgressFn | None = None,
) -> WriteStats:
    """Write a GGUF header with gguf-py, then stream every tensor's data, hashing as we go."""
    import gguf  # imported here: only writers need it
    import numpy as np  # deferred: only writers need numpy

    started = time.monotonic()
    arch = next(v for k, _, v in kv if k == "general.architecture")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(tmp, str(arch))
    w.kv_data[0].pop("general.architecture", None)  # re-added below in our order
    adders = {"str": w.add_string, "u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool}
    for key, kind, value in kv:
        if kind in adders:
            adders[kind](key, value)  # type: ignore[operator]
        elif kind == "i32[]":
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)  # type: ignore[arg-type]
        elif kind == "str[]":
            w.add_array(key, value)  # type: ignore[arg-type]
        else:
            raise AssertionError(kind)
    for s in specs:
        raw = None if s.qtype == "F32" else gguf.GGMLQuantizationType[s.qtype]
        w.add_tensor_info(s.name, tuple(reversed(s.ne)), np.dtype(np.float32), s.nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.flush()
    fout = w.fout[0]
    head_len = fout.tell()
    fout.flush()
    with open(tmp, "rb") as f:  # the header is small (the token list): hash it once, then stream
        header = f.read(head_len)
    out = _HashingWriter(fout)
    out.sha.update(header)
    out.n = head_len

    rng = np.random.default_rng(seed)
    buffers: dict[tuple[str, float], bytes] = {}
    total = sum(s.nbytes for s in specs)
    done = 0
    for s in specs:
        pad = (-out.n) % _ALIGN
        if pad:
            out.write(b"\0" * pad)
        sigma = _sigma(s)
        if s.qtype == "F32":
            out.write(_f32_data(s, rng, sigma))
        else:
            key = (s.qtype, round(sigma, 9))
            if key not in buffers:
                buffers[key] = _quant_buffer(s.qtype, sigma, rng)
            buf = memoryview(buffers[key])
            bsz = _QBLOCK[s.qtype][0]
            pos = int(rng.integers(0, _BUF_BLOCKS)) * bsz  # start somewhere else in the buffer each tensor
            left = s.nbytes
            while left:
                n = min(left, _CHUNK, len(buf) - pos)
                out.write(buf[pos : pos + n])
                left -= n
                pos = (pos + n) % len(buf)
                if on_progress:
                    on_progress(done + s.nbytes - left, total, s.name)
        done += s.nbytes
        if on_progress:
            on_progress(done, total, s.name)
    pad = (-out.n) % _ALIGN
    if pad:
        out.write(b"\0" * pad)
    digest = out.finish()
    w.close()
    os.replace(tmp, path)
    return WriteStats(str(path), out.n, round(time.monotonic() - started, 3), digest, len(specs))


# ------------------------------------------------------------------ the pair


def param_counts(t: TargetShape, specs: list[TensorSpec]) -> dict[str, float]:
    """Total and per-token active parameters and bytes (for the HBM bandwidth bound)."""
    total = sum(s.n_elements for s in specs)
    total_bytes = sum(s.nbytes for s in specs)
    frac = t.n_expert_used / t.n_expert
    active, active_bytes = 0.0, 0.0
    for s in specs:
        if s.role == "embd":  # one row per token
            active += s.ne[0]
            active_bytes += s.nbytes / s.ne[-1]
        elif s.role == "expert":
            active += s.n_elements * frac
            active_bytes += s.nbytes * frac
        else:
            active += s.n_elements
            active_bytes += s.nbytes
    return {
        "params_total": total,
        "params_active": int(active),
        "bytes_total": total_bytes,
        "bytes_active_per_token": int(active_bytes),
    }


def write_full_width(
    outdir: Path | str,
    *,
    shape: str = "minicpm-v-4.7-35b-a3b",
    qtype: str = "Q8_0",
    seed: int = 0,
    scale: float = 1.0,
    target_arch: str = "qwen35moe",
    draft_qtype: str | None = None,
    on_progress: ProgressFn | None = None,
) -> FullWidthPair:
    """Write a random-weight target + DSpark draft at ``shape`` (shrunk by ``scale``) and a manifest.

    Acceptance on this pair is meaningless (random weights): benchmark it with
    ``--spec-synth-len L``, and label the results synthetic. ``draft_qtype`` defaults to ``qtype``
    (upstream recommends a Q8_0 draft whatever the target's type).
    """
    draft_qtype = draft_qtype or qtype
    for q in (qtype, draft_qtype):
        if q not in QTYPES:
            raise UsageError(f"unsupported qtype {q!r}; choose one of {', '.join(QTYPES)}")
    t, d = shapes_for(shape, scale=scale, target_arch=target_arch)
    outdir = check_output_dir(outdir)
    tag = (
        f"{shape}-{t.arch}-{qtype}"
        + ("" if draft_qtype == qtype else f"-d{draft_qtype}")
        + ("" if scale == 1.0 else f"-s{scale:g}")
    )
    target_path, draft_path = outdir / f"target-{tag}.gguf", outdir / f"draft-dspark-{tag}.gguf"
    for path in (target_path, draft_path, outdir / f"manifest-{tag}.json"):
        if path.exists() or path.is_symlink():  # rewritten in place: a rerun, never a device or folder
            check_output_file(path, what="synth output")
    outdir.mkdir(parents=True, exist_ok=True)
    t_specs, d_specs = target_tensors(t, qtype), draft_tensors(d, draft_qtype)
    grand = sum(s.nbytes for s in t_specs) + sum(s.nbytes for s in d_specs)
    offset = 0

    def stage(done: int, total: int, what: str) -> None:
        if on_progress:
            on_progress(offset + done, grand, what)

    d_stats = write_gguf(draft_path, draft_kv(d), d_specs, seed=seed + 1, on_progress=stage)
    offset = sum(s.nbytes for s in d_specs)
    t_stats = write_gguf(target_path, target_kv(t), t_specs, seed=seed, on_progress=stage)

    manifest = {
        "kind": "dspark-full-width-synthetic-pair",
        "synthetic": True,
        "note": "random weights: acceptance is meaningless; emulate it with --spec-synth-len and label results synthetic",
        "dspark_version": __version__,
        "shape": shape,
        "scale": scale,
        "qtype": qtype,
        "draft_qtype": draft_qtype,
        "seed": seed,
        "target_arch": t.arch,
        "target_arch_reason": ARCH_REASON[t.arch],
        "target": {
            "file": target_path.name,
            "shape": asdict(t),
            **param_counts(t, t_specs),
            "sha256": t_stats.sha256,
            "bytes": t_stats.bytes,
            "write_seconds": t_stats.seconds,
            "write_mb_per_s": round(t_stats.mb_per_s, 1),
            "n_tensors": t_stats.n_tensors,
        },
        "draft": {
            "file": draft_path.name,
            "shape": asdict(d),
            "target_layers_convention": "GGUF: HF layer id + 1",
            "target_layers_hf": [x - 1 for x in d.target_layers],
            "params_total": sum(s.n_elements for s in d_specs),
            "sha256": d_stats.sha256,
            "bytes": d_stats.bytes,
            "write_seconds": d_stats.seconds,
            "write_mb_per_s": round(d_stats.mb_per_s, 1),
            "n_tensors": d_stats.n_tensors,
        },
    }
    manifest_path = outdir / f"manifest-{tag}.json"
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return FullWidthPair(target=target_path, draft=draft_path, manifest=manifest_path)


__all__ = [
    "SHAPES",
    "TARGET_ARCHS",
    "QTYPES",
    "FullWidthPair",
    "TargetShape",
    "DraftShape",
    "shapes_for",
    "target_tensors",
    "draft_tensors",
    "param_counts",
    "write_gguf",
    "write_full_width",
    "WriteStats",
]
