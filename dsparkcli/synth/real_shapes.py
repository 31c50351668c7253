"""The real pair's shapes that `dspark synth --shape` writes at full width (``minicpm-v-4.7-35b-a3b``: the
Qwen3.5-35B-A3B text tower as ``qwen35moe``, or the plain-attention ``qwen3moe`` stand-in, and its DSpark
draft), why each target arch (``ARCH_REASON``), and ``shapes_for``: the same structure shrunk for CPU tests."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dsparkcli.errors import UsageError

SHAPES = ("minicpm-v-4.7-35b-a3b",)
TARGET_ARCHS = ("qwen35moe", "qwen3moe")


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
