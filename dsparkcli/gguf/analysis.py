"""What a GGUF header says: per-type census, metadata summary and DSpark/DFlash structure; plus the sanitising
of untrusted text. Pure functions of a ``GGUFHeader`` (``gguf.reader``). The data-region hashes and the
per-tensor diff are ``gguf.hashes``'; the memory estimate ``gguf.memory``'s.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from dsparkcli.gguf.reader import GGUFArray, GGUFHeader, TensorInfo, ggml_type_name

# Required tensors of a plain (Qwen3-backbone) DFlash/DSpark draft: src/models/dflash.cpp:108-260.
DRAFT_GLOBAL_TENSORS = ("fc.weight", "enc.output_norm.weight", "output_norm.weight")
DRAFT_LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)
DSPARK_TENSORS = ("markov_w1.weight", "markov_w2.weight")
HEAD_TENSORS = ("fc.weight", "markov_w1.weight", "markov_w2.weight", "conf_proj.weight")

# ------------------------------------------------------------------ text safety


def printable(text: Any, max_len: int | None = 200) -> str:
    """Metadata is untrusted: escape control/format characters (terminal injection) and truncate."""
    s = str(text)
    if max_len is not None and len(s) > max_len:
        s = s[:max_len] + f"… (+{len(s) - max_len} chars)"
    out = []
    for ch in s:
        if ch in "\t\n\r" or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def role_of(h: GGUFHeader) -> str:
    """target | draft | mmproj, from the architecture."""
    return {"dflash": "draft", "clip": "mmproj"}.get(h.arch, "target")


# ------------------------------------------------------------------ census


@dataclass(frozen=True)
class CensusRow:
    type_name: str
    type_id: int
    count: int
    n_elements: int
    n_bytes: int | None
    share: float | None  # of all known tensor bytes
    bits_per_weight: float | None


@dataclass(frozen=True)
class Census:
    rows: tuple[CensusRow, ...]  # by bytes, largest first
    n_tensors: int
    n_params: int
    tensor_bytes: int  # known types only
    file_size: int
    file_bits_per_weight: float | None  # file size * 8 / params, as llama.cpp's loader prints
    unknown_types: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        return {r.type_name: r.count for r in self.rows}


def census(header: GGUFHeader) -> Census:
    """Tensor count, bytes, share and bits per weight per ggml type."""
    by_type: dict[int, list[TensorInfo]] = {}
    for t in header.tensors:
        by_type.setdefault(t.type_id, []).append(t)
    known_bytes = sum(t.n_bytes for t in header.tensors if t.n_bytes is not None)
    rows = []
    for type_id, group in by_type.items():
        n_el = sum(t.n_elements for t in group)
        sizes = [t.n_bytes for t in group]
        n_bytes = None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]
        rows.append(
            CensusRow(
                type_name=ggml_type_name(type_id),
                type_id=type_id,
                count=len(group),
                n_elements=n_el,
                n_bytes=n_bytes,
                share=(n_bytes / known_bytes) if n_bytes is not None and known_bytes else None,
                bits_per_weight=(n_bytes * 8 / n_el) if n_bytes is not None and n_el else None,
            )
        )
    rows.sort(key=lambda r: (-(r.n_bytes or 0), r.type_id))
    n_params = sum(t.n_elements for t in header.tensors)
    return Census(
        rows=tuple(rows),
        n_tensors=len(header.tensors),
        n_params=n_params,
        tensor_bytes=known_bytes,
        file_size=header.file_size,
        file_bits_per_weight=(header.file_size * 8 / n_params) if n_params else None,
        unknown_types=tuple(sorted({r.type_name for r in rows if r.n_bytes is None})),
    )


# ------------------------------------------------------------------ metadata summary


@dataclass(frozen=True)
class MetadataSummary:
    arch: str
    role: str  # target | draft | mmproj
    name: str | None
    blocks: int | None
    context: int | None
    embedding: int | None
    heads: int | None
    heads_kv: int | None
    vocab_size: int | None
    tokens_sha256: str | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos: int | None
    eos: int | None
    chat_template_chars: int | None
    chat_template_sha256: str | None
    file_type: int | None  # general.file_type: advisory, quantizers do not always update it
    file_type_name: str | None
    split: str | None = None  # "1 of 3" for a gguf-split shard: its census covers this shard only


def _scalar(v: Any) -> Any:
    if isinstance(v, GGUFArray):
        return max((x for x in (v.items or ()) if isinstance(x, int)), default=None)  # per-layer arrays: the max
    return v


def int_of(v: Any) -> int | None:
    v = _scalar(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def ints_of(v: Any) -> tuple[int, ...]:
    """An integer array's items; anything else (strings, floats, nested arrays: hostile metadata) is empty."""
    if not isinstance(v, GGUFArray) or not v.items or v.elem_type not in INT_TYPES:
        return ()
    return tuple(int(x) for x in v.items)


INT_TYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"})


def str_of(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def summarize(h: GGUFHeader) -> MetadataSummary:
    tokens = h.get("tokenizer.ggml.tokens")
    tmpl = str_of(h.get("tokenizer.chat_template"))
    ft = int_of(h.get("general.file_type"))
    ft_name = None
    if ft is not None:
        try:
            from gguf import LlamaFileType

            ft_name = LlamaFileType(ft).name
        except Exception:  # noqa: BLE001 - unknown or newer ids are shown as numbers
            ft_name = None
    return MetadataSummary(
        arch=h.arch or "?",
        role=role_of(h),
        name=str_of(h.get("general.name")),
        blocks=int_of(h.arch_key("block_count")),
        context=int_of(h.arch_key("context_length")),
        embedding=int_of(h.arch_key("embedding_length")),
        heads=int_of(h.arch_key("attention.head_count")),
        heads_kv=int_of(h.arch_key("attention.head_count_kv")),
        vocab_size=tokens.count if isinstance(tokens, GGUFArray) else None,
        tokens_sha256=tokens.sha256 if isinstance(tokens, GGUFArray) else None,
        tokenizer_model=str_of(h.get("tokenizer.ggml.model")),
        tokenizer_pre=str_of(h.get("tokenizer.ggml.pre")),
        bos=int_of(h.get("tokenizer.ggml.bos_token_id")),
        eos=int_of(h.get("tokenizer.ggml.eos_token_id")),
        chat_template_chars=len(tmpl) if tmpl is not None else None,
        chat_template_sha256=hashlib.sha256(tmpl.encode("utf-8", "surrogatepass")).hexdigest() if tmpl else None,
        file_type=ft,
        file_type_name=ft_name,
        split=(
            f"{(int_of(h.get('split.no')) or 0) + 1} of {int_of(h.get('split.count'))}"
            if (int_of(h.get("split.count")) or 0) > 1
            else None
        ),
    )


def metadata_json(h: GGUFHeader, max_string: int = 4096, max_items: int = 16) -> dict[str, Any]:
    """All KVs, JSON-friendly: arrays as {type, count, sha256, head}, very long strings cut."""
    out: dict[str, Any] = {}
    for key, value in h.kv.items():
        if isinstance(value, GGUFArray):
            head = list(value.items[:max_items]) if value.items is not None else None
            out[key] = {
                "type": value.elem_type,
                "count": value.count,
                "sha256": value.sha256,
                "head": [_json_item(x) for x in head] if head is not None else None,
            }
        elif isinstance(value, str) and len(value) > max_string:
            out[key] = value[:max_string] + f"… (+{len(value) - max_string} chars)"
        else:
            out[key] = _json_item(value)
    return out


def _json_item(x: Any) -> Any:
    if isinstance(x, GGUFArray):
        return {"type": x.elem_type, "count": x.count, "sha256": x.sha256}
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # strict JSON has no NaN/Infinity
    return x


# ------------------------------------------------------------------ DSpark / DFlash structure


@dataclass(frozen=True)
class DSparkStructure:
    kind: str  # dspark (has markov_w1) | dflash
    n_layer: int | None
    block_size: int | None
    target_layers: tuple[int, ...]
    mask_token_id: int | None
    markov_rank: int | None
    sample_from_anchor: bool  # llama.cpp's default is true when the key is absent
    confidence_head: bool  # conf_proj.weight present
    has_confidence_head_key: bool | None  # dflash.has_confidence_head (None: absent, llama.cpp assumes true)
    confidence_head_consistent: bool
    required_missing: tuple[str, ...]
    head_types: dict[str, str]
    max_spec_draft_n: int | None  # the largest --spec-draft-n-max that is not clamped
    n_head_kv: int | None
    head_dim: int | None
    kv_bytes_per_token: int | None  # f16 K and V
    problems: tuple[str, ...]


def head_dim_of(h: GGUFHeader) -> int | None:
    """The attention head size: key_length, else embedding_length / head_count."""
    key_len = int_of(h.arch_key("attention.key_length"))
    if key_len:
        return key_len
    e, n_head = int_of(h.arch_key("embedding_length")), int_of(h.arch_key("attention.head_count"))
    return e // n_head if e and n_head else None


def dspark_structure(h: GGUFHeader) -> DSparkStructure | None:
    """Block layout, heads and required tensors of a dflash-arch draft (None for anything else)."""
    if h.arch != "dflash":
        return None
    tensors = h.tensor_map()
    n_layer = int_of(h.arch_key("block_count"))
    block_size = int_of(h.arch_key("block_size"))
    taps_raw = h.arch_key("target_layers")
    taps = ints_of(taps_raw)
    mask = int_of(h.get("tokenizer.ggml.mask_token_id"))
    w1 = tensors.get("markov_w1.weight")
    kind = "dspark" if w1 is not None else "dflash"
    anchor_raw = h.arch_key("sample_from_anchor")
    anchor = bool(anchor_raw) if isinstance(anchor_raw, bool) else True
    conf = "conf_proj.weight" in tensors
    conf_key_raw = h.arch_key("has_confidence_head")
    conf_key = conf_key_raw if isinstance(conf_key_raw, bool) else None
    consistent = conf == (conf_key if conf_key is not None else True)

    required = list(DRAFT_GLOBAL_TENSORS)
    for b in range(min(n_layer or 0, 4096)):
        required += [f"blk.{b}.{t}.weight" for t in DRAFT_LAYER_TENSORS]
    if kind == "dspark":
        required += list(DSPARK_TENSORS)
    missing = tuple(t for t in required if t not in tensors)

    problems: list[str] = []
    if kind == "dspark" and block_size is None:
        problems.append("dflash.block_size is missing (llama.cpp asserts on DSpark drafts without it)")
    if not taps:
        problems.append("dflash.target_layers is missing (llama.cpp refuses the draft)")
    tokens = h.get("tokenizer.ggml.tokens")
    n_vocab = tokens.count if isinstance(tokens, GGUFArray) else None
    if mask is None:
        problems.append("tokenizer.ggml.mask_token_id is missing (every mask slot becomes an invalid token)")
    elif n_vocab is not None and mask >= n_vocab:
        problems.append(f"mask_token_id {mask} is outside the vocabulary ({n_vocab} tokens)")
    if n_vocab is None:
        problems.append("no tokenizer.ggml.tokens (convert the draft with --target-model-dir)")
    if w1 is not None and n_vocab is not None and len(w1.shape) > 1 and w1.shape[1] != n_vocab:
        problems.append(f"markov_w1 has {w1.shape[1]} rows but the vocabulary has {n_vocab} tokens")
    if missing:
        problems.append(
            f"{len(missing)} required tensor(s) missing: {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else "")
        )
    if not consistent:
        if conf:
            problems.append(
                "conf_proj.weight present but dflash.has_confidence_head = false "
                "(--spec-draft-p-min > 0 will be refused)"
            )
        else:
            problems.append(
                "no conf_proj.weight but dflash.has_confidence_head is not false (keep --spec-draft-p-min 0)"
            )

    if block_size is None:
        max_n = None if kind == "dspark" else 16 - 1  # DFlash falls back to a block of 16 at runtime
    else:
        max_n = block_size if (kind == "dspark" and anchor) else block_size - 1
    n_head_kv = int_of(h.arch_key("attention.head_count_kv")) or int_of(h.arch_key("attention.head_count"))
    head_dim = head_dim_of(h)
    kv = n_layer * 2 * n_head_kv * head_dim * 2 if n_layer and n_head_kv and head_dim else None
    return DSparkStructure(
        kind=kind,
        n_layer=n_layer,
        block_size=block_size,
        target_layers=taps,
        mask_token_id=mask,
        markov_rank=w1.shape[0] if w1 is not None and w1.shape else None,
        sample_from_anchor=anchor,
        confidence_head=conf,
        has_confidence_head_key=conf_key,
        confidence_head_consistent=consistent,
        required_missing=missing,
        head_types={n: tensors[n].type_name for n in HEAD_TENSORS if n in tensors},
        max_spec_draft_n=max_n,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        kv_bytes_per_token=kv,
        problems=tuple(problems),
    )
