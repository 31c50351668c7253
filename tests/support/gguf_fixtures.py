"""Builders of test GGUFs, written with gguf-py (the real writer), laid out like the real files.

The draft mirrors `dspark-MiniCPM-V-4.7-35B-A3B-NVFP4A16-q8heads.gguf` (97 tensors = 35 NVFP4 + 3 Q8_0 +
58 F32 + 1 BF16) with small dimensions: 5 blocks x (7 NVFP4 projections + their 7 F32 `.scale` tensors +
4 F32 norms) + fc/markov_w1/markov_w2 heads + enc.output_norm/output_norm + conf_proj weight (BF16) and
bias (F32). Tensor bytes are random but seeded by tensor name, so two files share identical data
regions exactly where the tensor is unchanged (the "heads requantised" pair: 94/97 identical).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

# Small stand-ins for the real draft's dimensions (E 2048, R 256, V 248144, n_ff 6144, head_dim 256).
E, HEAD_DIM, N_HEAD, N_HEAD_KV, N_FF, RANK, VOCAB, N_BLOCKS = 256, 64, 4, 2, 512, 64, 1000, 5
TAPS = (4, 12, 20, 28, 36)  # HF ids 3/11/19/27/35 + 1, as the converter writes them
BLOCK_SIZE, MASK_ID = 15, 998
PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")


def tokens(vocab: int = VOCAB, *, swap: tuple[int, int] | None = None) -> list[str]:
    toks = [f"tok{i}" for i in range(vocab)]
    if swap is not None:  # same count, different strings: a different tokenizer of the same size
        a, b = swap
        toks[a], toks[b] = toks[b], toks[a]
    return toks


def _rng(name: str, salt: str = "") -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256((salt + name).encode()).digest()[:8], "little"))


def _raw(name: str, ne: tuple[int, ...], qtype: Q, salt: str = "") -> np.ndarray:
    """Random bytes of exactly the size ggml expects, as the writer wants them (numpy = reversed ne)."""
    block, size = GGML_QUANT_SIZES[qtype]
    rows = list(reversed(ne))
    if qtype in (Q.F32,):
        return _rng(name, salt).standard_normal(rows).astype(np.float32)
    if qtype in (Q.BF16, Q.F16):
        return _rng(name, salt).integers(0, 1 << 16, size=rows, dtype=np.uint16)
    assert ne[0] % block == 0, (name, ne, qtype)
    rows[-1] = ne[0] // block * size
    return _rng(name, salt).integers(0, 256, size=rows, dtype=np.uint8)


def _add(w: GGUFWriter, name: str, ne: tuple[int, ...], qtype: Q, salt: str = "") -> None:
    arr = _raw(name, ne, qtype, salt)
    if qtype in (Q.BF16, Q.F16):
        w.add_tensor(name, arr, raw_dtype=qtype)
    elif qtype == Q.F32:
        w.add_tensor(name, arr)
    else:
        w.add_tensor(name, arr, raw_dtype=qtype)


def _tokenizer(
    w: GGUFWriter, toks: list[str], bos: int | None = 1, eos: int | None = 2, mask: int | None = None
) -> None:
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", toks)
    w.add_array("tokenizer.ggml.token_type", [1] * len(toks))
    if bos is not None:
        w.add_uint32("tokenizer.ggml.bos_token_id", bos)
    if eos is not None:
        w.add_uint32("tokenizer.ggml.eos_token_id", eos)
    if mask is not None:
        w.add_uint32("tokenizer.ggml.mask_token_id", mask)


def _write(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class DraftSpec:
    heads: Q = Q.Q8_0  # markov_w1 / markov_w2 / fc
    conf_shape: tuple[int, ...] = (E + RANK,)  # the q8heads file spells it (2304); the BF16-heads one (2304, 1)
    vocab: int = VOCAB
    embd: int = E
    taps: tuple[int, ...] = TAPS
    block_size: int | None = BLOCK_SIZE
    sample_from_anchor: bool | None = None  # None: key absent (llama.cpp's default is true)
    has_confidence_head: bool | None = True
    with_conf_proj: bool = True
    drop: tuple[str, ...] = ()  # tensor names to leave out
    token_swap: tuple[int, int] | None = None
    bos: int | None = 1
    eos: int | None = 2
    chat_template: str = "{% for m in messages %}{{ m.content }}{% endfor %}"
    name: str = "MiniCPM-V-4.7-35B-A3B-DSpark"


def write_draft(path: Path, spec: DraftSpec = DraftSpec()) -> Path:
    """A DSpark draft (arch dflash) with the real draft's 97-tensor layout at small dimensions."""
    e = spec.embd
    w = GGUFWriter(path, "dflash")
    w.add_name(spec.name)
    w.add_file_type(7)  # MOSTLY_Q8_0: what the real file claims (advisory)
    w.add_uint32("dflash.context_length", 262144)
    w.add_uint32("dflash.embedding_length", e)
    w.add_uint32("dflash.block_count", N_BLOCKS)
    w.add_uint32("dflash.feed_forward_length", N_FF)
    w.add_uint32("dflash.attention.head_count", N_HEAD)
    w.add_uint32("dflash.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32("dflash.attention.key_length", HEAD_DIM)
    w.add_uint32("dflash.attention.value_length", HEAD_DIM)
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("dflash.rope.freq_base", 1e7)
    w.add_array("dflash.target_layers", list(spec.taps))
    if spec.block_size is not None:
        w.add_uint32("dflash.block_size", spec.block_size)
    if spec.sample_from_anchor is not None:
        w.add_bool("dflash.sample_from_anchor", spec.sample_from_anchor)
    if spec.has_confidence_head is not None:
        w.add_bool("dflash.has_confidence_head", spec.has_confidence_head)
    _tokenizer(w, tokens(spec.vocab, swap=spec.token_swap), spec.bos, spec.eos, MASK_ID)
    w.add_string("tokenizer.chat_template", spec.chat_template)

    q_out, kv_out = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    proj_ne = {
        "attn_q": (e, q_out),
        "attn_k": (e, kv_out),
        "attn_v": (e, kv_out),
        "attn_output": (q_out, e),
        "ffn_gate": (e, N_FF),
        "ffn_up": (e, N_FF),
        "ffn_down": (N_FF, e),
    }
    layout: list[tuple[str, tuple[int, ...], Q]] = []
    for b in range(N_BLOCKS):
        for p in PROJ:
            layout.append((f"blk.{b}.{p}.weight", proj_ne[p], Q.NVFP4))
            layout.append((f"blk.{b}.{p}.scale", (1,), Q.F32))
        for n in NORMS:
            layout.append((f"blk.{b}.{n}.weight", (HEAD_DIM,) if n in ("attn_q_norm", "attn_k_norm") else (e,), Q.F32))
    layout += [
        ("fc.weight", (len(spec.taps) * e, e), spec.heads),
        ("enc.output_norm.weight", (e,), Q.F32),
        ("output_norm.weight", (e,), Q.F32),
        ("markov_w1.weight", (RANK, spec.vocab), spec.heads),
        ("markov_w2.weight", (RANK, spec.vocab), spec.heads),
    ]
    if spec.with_conf_proj:
        layout += [("conf_proj.weight", spec.conf_shape, Q.BF16), ("conf_proj.bias", (1,), Q.F32)]
    for name, ne, qtype in layout:
        if name in spec.drop:
            continue
        if name == "conf_proj.weight":  # same bytes whatever the shape spelling
            arr = _raw(name, (E + RANK,), Q.BF16).reshape(tuple(reversed(ne)))
            w.add_tensor(name, arr, raw_dtype=Q.BF16)
        else:
            _add(w, name, ne, qtype)
    return _write(w, path)


def write_target(
    path: Path,
    *,
    arch: str = "qwen35moe",
    embd: int = E,
    n_layer: int = 40,
    vocab: int = VOCAB,
    token_swap: tuple[int, int] | None = None,
    bos: int | None = 1,
    eos: int | None = 2,
    n_head: int = 16,
    n_head_kv: int = 2,
    head_dim: int = 64,
    full_attention_interval: int | None = 4,
) -> Path:
    """A target header with real metadata and only its token embedding / head tensors (enough to pair)."""
    w = GGUFWriter(path, arch)
    w.add_name("MiniCPM-V-4.7-35B-A3B")
    w.add_uint32(f"{arch}.context_length", 262144)
    w.add_uint32(f"{arch}.embedding_length", embd)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.attention.value_length", head_dim)
    if full_attention_interval is not None:
        w.add_uint32(f"{arch}.full_attention_interval", full_attention_interval)
    _tokenizer(w, tokens(vocab, swap=token_swap), bos, eos)
    _add(w, "token_embd.weight", (embd, vocab), Q.Q8_0)
    _add(w, "output_norm.weight", (embd,), Q.F32)
    _add(w, "output.weight", (embd, vocab), Q.Q8_0)
    return _write(w, path)


def write_mmproj(path: Path, *, out_width: int = E, projector: str = "mlp", hidden: int = 128) -> Path:
    """A clip projector (llava mlp): mm.2.weight's ne[1] is the width it feeds the text model."""
    w = GGUFWriter(path, "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", projector)
    w.add_uint32("clip.vision.embedding_length", 64)
    w.add_uint32("clip.vision.projection_dim", out_width)
    _add(w, "mm.0.weight", (64, hidden), Q.F32)
    _add(w, "mm.2.weight", (hidden, out_width), Q.F32)
    _add(w, "mm.2.bias", (out_width,), Q.F32)
    return _write(w, path)


def write_sparse(path: Path, total_size: int, n_tensors: int = 97) -> Path:
    """A GGUF whose tensor data is a hole: the real header, then truncate() to total_size bytes."""
    per = (total_size - (1 << 20)) // n_tensors // (1 << 16) * (1 << 16)  # F16 elements are 2 bytes
    w = GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.embedding_length", 4096)
    for i in range(n_tensors):
        w.add_tensor_info(f"blk.0.t{i}.weight", (per // 2 // 4096, 4096), np.dtype(np.float16), per)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(total_size)
    return path


# ------------------------------------------------------------------ raw headers (for hostile-input tests)


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def raw_header(
    kvs: list[tuple[str | bytes, int, bytes]] = (),
    tensors: list[tuple[str | bytes, tuple[int, ...], int, int]] = (),
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    magic: bytes = b"GGUF",
    data: bytes = b"",
) -> bytes:
    """Hand-assembled GGUF bytes, so a test can lie about any field. kvs: (key, type id, encoded value)."""
    out = magic + struct.pack("<I", version)
    out += struct.pack("<qq", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    for key, vtype, value in kvs:
        out += _s(key) + struct.pack("<i", vtype) + value
    for name, ne, type_id, offset in tensors:
        out += (
            _s(name)
            + struct.pack("<I", len(ne))
            + struct.pack(f"<{len(ne)}q", *ne)
            + struct.pack("<iQ", type_id, offset)
        )
    if tensors:
        out += b"\0" * (-len(out) % 32)
    return out + data


def kv_u32(value: int) -> bytes:
    return struct.pack("<I", value)


def kv_str(text: str | bytes) -> bytes:
    return _s(text)


def kv_str_array(items: list[str | bytes], count: int | None = None) -> bytes:
    return struct.pack("<iQ", 8, len(items) if count is None else count) + b"".join(_s(i) for i in items)
