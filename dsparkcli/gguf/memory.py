"""How much memory a GGUF file needs at a context size, from its header: the K/V cache per token
(``kv_cache_estimate``: attention layers only in hybrids, nothing for recurrent archs), weights plus cache
(``memory_estimate``), and both per llama.cpp layer (``layer_bytes``, for the layer split of a placement)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsparkcli.errors import UsageError
from dsparkcli.gguf.analysis import census, head_dim_of, int_of, ints_of, role_of
from dsparkcli.gguf.reader import GGUFArray, GGUFHeader

RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)

KV_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


@dataclass(frozen=True)
class KVCacheEstimate:
    n_layer: int
    n_kv_layers: int  # layers that keep K/V per token (hybrid archs: only the attention layers)
    n_head_kv: int
    key_length: int
    value_length: int
    bytes_per_element: float
    bytes_per_token: int
    formula: str
    notes: tuple[str, ...]


@dataclass(frozen=True)
class MemoryEstimate:
    name: str
    role: str
    weights_by_type: dict[str, int]
    weights_bytes: int
    ctx: int
    kv: KVCacheEstimate | None
    kv_bytes: int
    total_bytes: int
    trained_ctx: int | None = None  # the model's context_length: llama.cpp runs past it, the text degrades

    @property
    def past_context(self) -> str | None:
        """A warning when -c is past the model's trained context (else the estimate, GiBs of KV cache for a
        context the model never saw, reads as if it were fine)."""
        if self.trained_ctx is None or self.kv is None or self.ctx <= self.trained_ctx:
            return None
        return (
            f"-c {self.ctx} is past the {self.trained_ctx}-token context {self.name} was trained for "
            f"(context_length); llama-server runs it, but answers past {self.trained_ctx} tokens degrade"
        )


def kv_cache_estimate(h: GGUFHeader, kv_type: str = "f16") -> KVCacheEstimate | None:
    """llama-style K/V bytes per context token: n_kv_layers x n_head_kv x (k_len + v_len) x bytes."""
    if role_of(h) == "mmproj":
        return None
    arch = h.arch
    n_layer = int_of(h.arch_key("block_count"))
    if not n_layer:
        return None
    per_elem = KV_TYPE_BYTES[kv_type]
    notes: list[str] = []
    if arch in RECURRENT_ARCHS:
        return KVCacheEstimate(
            n_layer,
            0,
            0,
            0,
            0,
            per_elem,
            0,
            "0 (recurrent: a fixed state per sequence)",
            ("recurrent arch: the state does not grow with context",),
        )
    heads_kv_raw = h.arch_key("attention.head_count_kv")
    n_head = int_of(h.arch_key("attention.head_count")) or 0
    head_dim = head_dim_of(h) or 0
    k_len = int_of(h.arch_key("attention.key_length")) or head_dim
    v_len = int_of(h.arch_key("attention.value_length")) or head_dim
    if isinstance(heads_kv_raw, GGUFArray) and heads_kv_raw.items:
        per_layer = list(ints_of(heads_kv_raw))[:n_layer]
        kv_layers = [x for x in per_layer if x > 0]
        n_kv_layers, n_head_kv = len(kv_layers), max(kv_layers, default=0)
        total_heads = sum(kv_layers)
        if n_kv_layers < n_layer:
            notes.append(f"hybrid: {n_kv_layers} of {n_layer} layers are attention layers (per-layer head_count_kv)")
    else:
        n_head_kv = int_of(heads_kv_raw) or n_head
        interval = int_of(h.arch_key("full_attention_interval"))
        n_kv_layers = n_layer // interval if interval else n_layer
        if interval:
            notes.append(f"hybrid: every {interval}th layer is full attention ({n_kv_layers} of {n_layer})")
        total_heads = n_kv_layers * n_head_kv
    if arch in HYBRID_ARCHS or arch in RECURRENT_ARCHS:
        notes.append("recurrent layers add a fixed per-sequence state, not counted here")
    if h.arch_key("attention.sliding_window") is not None:
        notes.append(
            f"sliding-window layers keep at most {int_of(h.arch_key('attention.sliding_window'))} tokens; "
            "this counts every layer at full context"
        )
    per_token = int(total_heads * (k_len + v_len) * per_elem)
    if k_len == v_len:
        formula = (
            f"{n_kv_layers} layers x 2 x {n_head_kv} kv heads x {k_len} head dim x {per_elem:g} B = {per_token} B"
        )
    else:
        formula = f"{n_kv_layers} layers x {n_head_kv} kv heads x ({k_len} + {v_len}) x {per_elem:g} B = {per_token} B"
    return KVCacheEstimate(n_layer, n_kv_layers, n_head_kv, k_len, v_len, per_elem, per_token, formula, tuple(notes))


def memory_estimate(h: GGUFHeader, ctx: int, kv_type: str = "f16") -> MemoryEstimate:
    if ctx <= 0:
        raise UsageError(f"-c must be a positive context size, got {ctx}")
    c = census(h)
    weights = {r.type_name: r.n_bytes for r in c.rows if r.n_bytes is not None}
    kv = kv_cache_estimate(h, kv_type)
    kv_bytes = kv.bytes_per_token * ctx if kv else 0
    return MemoryEstimate(
        name=h.name,
        role=role_of(h),
        weights_by_type=weights,
        weights_bytes=c.tensor_bytes,
        ctx=ctx,
        kv=kv,
        kv_bytes=kv_bytes,
        total_bytes=c.tensor_bytes + kv_bytes,
        trained_ctx=int_of(h.arch_key("context_length")),
    )


@dataclass(frozen=True)
class LayerBytes:
    """Weights by llama.cpp layer: ``blk.N.*`` per repeating layer, the input embedding, the rest (output
    head and norm; a draft's own extras) counted with the output layer, as load_tensors places them."""

    layers: tuple[int, ...]
    input_bytes: int
    output_bytes: int
    kv_per_token: tuple[int, ...]  # K/V bytes per context token, per repeating layer


_BLK = re.compile(r"^blk\.(\d+)\.")


def layer_bytes(h: GGUFHeader, kv_type: str = "f16") -> LayerBytes:
    n_layer = int_of(h.arch_key("block_count")) or 0
    layers = [0] * n_layer
    input_bytes = output_bytes = 0
    for t in h.tensors:
        size = t.n_bytes or 0
        m = _BLK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += size
        elif t.name.startswith("token_embd."):
            input_bytes += size
        else:
            output_bytes += size
    kv = kv_cache_estimate(h, kv_type)
    per_layer = [0] * n_layer
    if kv is not None and kv.bytes_per_token and n_layer:
        heads_kv = h.arch_key("attention.head_count_kv")
        per_head = (kv.key_length + kv.value_length) * kv.bytes_per_element
        if isinstance(heads_kv, GGUFArray) and heads_kv.items:
            per_layer = [int(x * per_head) for x in list(ints_of(heads_kv))[:n_layer]]
        else:
            interval = int_of(h.arch_key("full_attention_interval"))
            # llama.cpp's hybrids keep K/V in every interval-th layer (il + 1) % interval == 0
            per_layer = [
                int(kv.n_head_kv * per_head) if not interval or (il + 1) % interval == 0 else 0
                for il in range(n_layer)
            ]
    return LayerBytes(tuple(layers), input_bytes, output_bytes, tuple(per_layer))
