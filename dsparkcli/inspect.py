"""What a GGUF is and whether a draft fits its target, from headers only (plus hashes on request).

Built on ``gguf_census``: metadata summary, DSpark/DFlash structure, pairing verdict (``check_pair``,
also called by ``run`` before llama-server starts), per-tensor diff, ``models.toml`` expectations, a
memory estimate, and ``hf://owner/repo[@rev]/path.gguf`` headers read through HTTP range requests.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import math
import os
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dsparkcli import gguf_census
from dsparkcli.errors import GGUFError, UsageError
from dsparkcli.hfref import HubLocation, parse_hf_uri
from dsparkcli.gguf_census import Census, FileHashes, GGUFArray, GGUFHeader, TensorInfo

# Target archs whose graph fills t_layer_inp (llama.cpp 0c1e570, grep t_layer_inp in src/models/); only
# these can feed a DFlash/DSpark draft. The second set also exposes index n_layer (the last layer's output).
LAYER_INPUT_ARCHS = frozenset({
    "llama", "llama-embed", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4", "lfm2",
    "mimo2", "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "nemotron_h_moe", "gpt-oss",
    "bailingmoe3", "hunyuan_vl", "deepseek4",
})
LAST_LAYER_TAP_ARCHS = frozenset({"mimo2", "nemotron_h", "nemotron_h_moe", "deepseek4"})
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next",
    "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})

# Required tensors of a plain (Qwen3-backbone) DFlash/DSpark draft: src/models/dflash.cpp:108-260.
DRAFT_GLOBAL_TENSORS = ("fc.weight", "enc.output_norm.weight", "output_norm.weight")
DRAFT_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_norm",
                       "ffn_gate", "ffn_up", "ffn_down")
DSPARK_TENSORS = ("markov_w1.weight", "markov_w2.weight")
HEAD_TENSORS = ("fc.weight", "markov_w1.weight", "markov_w2.weight", "conf_proj.weight")

# clip projector type -> (tensor, ne index) giving the width it feeds the text model (clip_n_mmproj_embd).
MMPROJ_WIDTH = {
    **{p: ("mm.2.weight", 1) for p in ("mlp", "phi4", "pixtral", "lightonocr", "dots_ocr", "muse-glimmer", "ultravox",
                                       "voxtral", "musicflamingo", "qwen3a", "glma", "lfm2", "kimivl", "paddleocr",
                                       "kimik25", "yasa2", "deepseek4v", "mimo_audio")},
    "mlp_norm": ("mm.3.bias", 0),
    "resampler": ("resampler.proj.weight", 0),
    "minicpmv4_6": ("mm.down.weight", 1),
    "glm4v": ("mm.down.weight", 1), "glm5v": ("mm.down.weight", 1),
    "qwen2vl_merger": ("mm.2.bias", 0), "qwen2.5vl_merger": ("mm.2.bias", 0), "ling3vl": ("mm.2.bias", 0),
    "gemma3": ("mm.input_projection.weight", 0), "gemma3nv": ("mm.input_projection.weight", 0),
    "gemma4v": ("mm.input_projection.weight", 1), "gemma4uv": ("mm.input_projection.weight", 1),
    "idefics3": ("mm.model.fc.weight", 1), "internvl": ("mm.3.weight", 1), "nemotron_v2_vl": ("mm.3.weight", 1),
}

KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}


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


# ------------------------------------------------------------------ opening files (local or hf://)


class HubRangeSource:
    """A hub file read by HTTP range requests through huggingface_hub's session (header bytes only)."""

    def __init__(self, loc: HubLocation, endpoint: str | None = None) -> None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        from dsparkcli import hub

        self.loc = loc
        self.name = f"hf://{loc.repo}/{loc.filename}"
        self.endpoint = endpoint or hub.hf_endpoint()
        self.url = hf_hub_url(loc.repo, loc.filename, revision=loc.revision, endpoint=self.endpoint)
        with hub._hub_errors(loc.repo, loc.revision, self.name):
            meta = get_hf_file_metadata(self.url, endpoint=self.endpoint)
        if meta.size is None:
            raise GGUFError(f"{self.name}: the hub did not report a size")
        self.size = int(meta.size)
        etag = (meta.etag or "").strip('"')
        self.sha256 = etag if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag) else None
        self.location = meta.location or self.url
        self.bytes_fetched = 0
        self.requests = 0

    def read_at(self, offset: int, n: int) -> bytes:
        from huggingface_hub.utils import (
            build_hf_headers,
            get_session,
            hf_raise_for_status,
        )

        from dsparkcli import hub

        if n <= 0:
            return b""
        same_host = urlsplit(self.location).netloc == urlsplit(self.endpoint).netloc
        # the token goes to the hub only, never to the CDN a resolve URL redirects to
        headers = {**(build_hf_headers() if same_host else {}), "Range": f"bytes={offset}-{offset + n - 1}"}
        chunks: list[bytes] = []
        got = 0
        with hub._hub_errors(self.loc.repo, self.loc.revision, self.name), \
                get_session().stream("GET", self.location, headers=headers, follow_redirects=True, timeout=60) as resp:
            hf_raise_for_status(resp)
            skip = offset if resp.status_code == 200 else 0  # a server that ignores Range: stop early anyway
            for chunk in resp.iter_bytes():
                if skip:
                    drop = min(skip, len(chunk))
                    chunk, skip = chunk[drop:], skip - drop
                chunks.append(chunk)
                got += len(chunk)
                if got >= n:
                    break
        self.requests += 1
        data = b"".join(chunks)[:n]
        self.bytes_fetched += len(data)
        return data


def read_gguf(spec: str | os.PathLike[str] | GGUFHeader, *, endpoint: str | None = None) -> GGUFHeader:
    """A header from a local path or an hf:// address (never the tensor data)."""
    if isinstance(spec, GGUFHeader):
        return spec
    text = str(spec)
    if text.startswith("hf://"):
        src = HubRangeSource(parse_hf_uri(text), endpoint)
        return dataclasses.replace(gguf_census.read_header(src), remote_sha256=src.sha256)
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"file not found: {printable(text)}")
    return gguf_census.read_header(path)


def _role(h: GGUFHeader) -> str:
    return {"dflash": "draft", "clip": "mmproj"}.get(h.arch, "target")


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


def _int(v: Any) -> int | None:
    v = _scalar(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _ints(v: Any) -> tuple[int, ...]:
    """An integer array's items; anything else (strings, floats, nested arrays: hostile metadata) is empty."""
    if not isinstance(v, GGUFArray) or not v.items or v.elem_type not in _INT_TYPES:
        return ()
    return tuple(int(x) for x in v.items)


_INT_TYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"})


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def summarize(h: GGUFHeader) -> MetadataSummary:
    tokens = h.get("tokenizer.ggml.tokens")
    tmpl = _str(h.get("tokenizer.chat_template"))
    ft = _int(h.get("general.file_type"))
    ft_name = None
    if ft is not None:
        try:
            from gguf import LlamaFileType

            ft_name = LlamaFileType(ft).name
        except Exception:  # noqa: BLE001 - unknown or newer ids are shown as numbers
            ft_name = None
    return MetadataSummary(
        arch=h.arch or "?", role=_role(h), name=_str(h.get("general.name")),
        blocks=_int(h.arch_key("block_count")), context=_int(h.arch_key("context_length")),
        embedding=_int(h.arch_key("embedding_length")), heads=_int(h.arch_key("attention.head_count")),
        heads_kv=_int(h.arch_key("attention.head_count_kv")),
        vocab_size=tokens.count if isinstance(tokens, GGUFArray) else None,
        tokens_sha256=tokens.sha256 if isinstance(tokens, GGUFArray) else None,
        tokenizer_model=_str(h.get("tokenizer.ggml.model")), tokenizer_pre=_str(h.get("tokenizer.ggml.pre")),
        bos=_int(h.get("tokenizer.ggml.bos_token_id")), eos=_int(h.get("tokenizer.ggml.eos_token_id")),
        chat_template_chars=len(tmpl) if tmpl is not None else None,
        chat_template_sha256=hashlib.sha256(tmpl.encode("utf-8", "surrogatepass")).hexdigest() if tmpl else None,
        file_type=ft, file_type_name=ft_name,
        split=(f"{(_int(h.get('split.no')) or 0) + 1} of {_int(h.get('split.count'))}"
               if (_int(h.get("split.count")) or 0) > 1 else None),
    )


def metadata_json(h: GGUFHeader, max_string: int = 4096, max_items: int = 16) -> dict[str, Any]:
    """All KVs, JSON-friendly: arrays as {type, count, sha256, head}, very long strings cut."""
    out: dict[str, Any] = {}
    for key, value in h.kv.items():
        if isinstance(value, GGUFArray):
            head = list(value.items[:max_items]) if value.items is not None else None
            out[key] = {"type": value.elem_type, "count": value.count, "sha256": value.sha256,
                        "head": [_json_item(x) for x in head] if head is not None else None}
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


def _head_dim(h: GGUFHeader) -> int | None:
    key_len = _int(h.arch_key("attention.key_length"))
    if key_len:
        return key_len
    e, n_head = _int(h.arch_key("embedding_length")), _int(h.arch_key("attention.head_count"))
    return e // n_head if e and n_head else None


def dspark_structure(h: GGUFHeader) -> DSparkStructure | None:
    """Block layout, heads and required tensors of a dflash-arch draft (None for anything else)."""
    if h.arch != "dflash":
        return None
    tensors = h.tensor_map()
    n_layer = _int(h.arch_key("block_count"))
    block_size = _int(h.arch_key("block_size"))
    taps_raw = h.arch_key("target_layers")
    taps = _ints(taps_raw)
    mask = _int(h.get("tokenizer.ggml.mask_token_id"))
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
        problems.append(f"{len(missing)} required tensor(s) missing: {', '.join(missing[:5])}"
                        + (" …" if len(missing) > 5 else ""))
    if not consistent:
        if conf:
            problems.append("conf_proj.weight present but dflash.has_confidence_head = false "
                            "(--spec-draft-p-min > 0 will be refused)")
        else:
            problems.append("no conf_proj.weight but dflash.has_confidence_head is not false "
                            "(keep --spec-draft-p-min 0)")

    if block_size is None:
        max_n = None if kind == "dspark" else 16 - 1  # DFlash falls back to a block of 16 at runtime
    else:
        max_n = block_size if (kind == "dspark" and anchor) else block_size - 1
    n_head_kv = _int(h.arch_key("attention.head_count_kv")) or _int(h.arch_key("attention.head_count"))
    head_dim = _head_dim(h)
    kv = n_layer * 2 * n_head_kv * head_dim * 2 if n_layer and n_head_kv and head_dim else None
    return DSparkStructure(
        kind=kind, n_layer=n_layer, block_size=block_size, target_layers=taps, mask_token_id=mask,
        markov_rank=w1.shape[0] if w1 is not None and w1.shape else None, sample_from_anchor=anchor,
        confidence_head=conf, has_confidence_head_key=conf_key, confidence_head_consistent=consistent,
        required_missing=missing, head_types={n: tensors[n].type_name for n in HEAD_TENSORS if n in tensors},
        max_spec_draft_n=max_n, n_head_kv=n_head_kv, head_dim=head_dim, kv_bytes_per_token=kv,
        problems=tuple(problems),
    )


# ------------------------------------------------------------------ pairing


@dataclass(frozen=True)
class PairCheck:
    name: str
    ok: bool | None  # None: could not be checked (shown, but does not fail the pair)
    detail: str


@dataclass(frozen=True)
class PairVerdict:
    ok: bool
    reasons: tuple[str, ...]  # one per failed check
    checks: tuple[PairCheck, ...]
    target: str = ""
    draft: str | None = None
    mmproj: str | None = None


def _first_token_difference(a: GGUFArray, b: GGUFArray) -> str:
    if a.items is None or b.items is None:
        return ""
    for i, (x, y) in enumerate(zip(a.items, b.items)):
        if x != y:
            return f"; first difference at id {i}: {printable(x, 24)!s} vs {printable(y, 24)!s}"
    return ""


def mmproj_width(h: GGUFHeader) -> tuple[int | None, str]:
    """(width the projector feeds the text model, how it was found)."""
    ptype = _str(h.get("clip.vision.projector_type")) or _str(h.get("clip.projector_type")) or "mlp"
    tensors = h.tensor_map()
    if ptype in MMPROJ_WIDTH:
        name, axis = MMPROJ_WIDTH[ptype]
        t = tensors.get(name)
        if t is not None and len(t.shape) > axis:
            return t.shape[axis], f"{name} ne[{axis}] ({printable(ptype, 40)})"
    if ptype == "qwen3vl_merger":
        t = tensors.get("mm.2.bias")
        deep = h.get("clip.vision.is_deepstack_layers")
        n_deep = sum(1 for x in (deep.items or ()) if x) if isinstance(deep, GGUFArray) else 0
        if t is not None and t.shape:
            return t.shape[0] * (1 + n_deep), f"mm.2.bias ne[0] x (1 + {n_deep} deepstack) (qwen3vl_merger)"
    return None, f"projector type '{printable(ptype, 40)}' not known to dspark"


def check_pair(target: str | os.PathLike[str] | GGUFHeader, draft: str | os.PathLike[str] | GGUFHeader | None = None,
               mmproj: str | os.PathLike[str] | GGUFHeader | None = None) -> PairVerdict:
    """Does this draft (and/or mmproj) fit this target? Headers only, so cheap enough to run before launch."""
    t = read_gguf(target)
    d = read_gguf(draft) if draft is not None else None
    m = read_gguf(mmproj) if mmproj is not None else None
    checks: list[PairCheck] = []
    t_layers = _int(t.arch_key("block_count"))
    t_embd = _int(t.arch_key("embedding_length"))
    checks.append(PairCheck("target role", _role(t) == "target",
                            f"arch {printable(t.arch or '?', 40)}" + ("" if _role(t) == "target" else
                                                                      " is not a text model")))
    if d is not None:
        arch_ok = t.arch in LAYER_INPUT_ARCHS
        checks.append(PairCheck("target exposes layer inputs", arch_ok,
                                f"{printable(t.arch or '?', 40)} " + ("fills t_layer_inp" if arch_ok else
                                "does not fill t_layer_inp: llama.cpp cannot feed a DFlash/DSpark draft from it")))
        checks.append(PairCheck("draft arch", d.arch == "dflash", f"{printable(d.arch or '?', 40)}"
                                + ("" if d.arch == "dflash" else " (expected dflash)")))
        tt, dt = t.get("tokenizer.ggml.tokens"), d.get("tokenizer.ggml.tokens")
        if not isinstance(tt, GGUFArray) or not isinstance(dt, GGUFArray):
            which = "target" if not isinstance(tt, GGUFArray) else "draft"
            checks.append(PairCheck("vocab", False, f"{which} has no tokenizer.ggml.tokens"))
        elif tt.count != dt.count:
            checks.append(PairCheck("vocab", False, f"target has {tt.count} tokens, draft {dt.count}"))
        elif tt.sha256 != dt.sha256:
            checks.append(PairCheck("vocab", False, f"same count ({tt.count}) but different token strings"
                                    + _first_token_difference(tt, dt)))
        else:
            checks.append(PairCheck("vocab", True, f"{tt.count} tokens, sha256 {tt.sha256[:12]} in both"))
        for key, label in (("tokenizer.ggml.bos_token_id", "BOS"), ("tokenizer.ggml.eos_token_id", "EOS")):
            tv, dv = _int(t.get(key)), _int(d.get(key))
            checks.append(PairCheck(label, tv == dv, f"target {tv if tv is not None else 'unset'}, "
                                                     f"draft {dv if dv is not None else 'unset'}"))
        d_embd = _int(d.arch_key("embedding_length"))
        checks.append(PairCheck("hidden size", t_embd is not None and t_embd == d_embd,
                                f"target {t_embd}, draft {d_embd}"))
        s = dspark_structure(d)
        taps = s.target_layers if s else ()
        limit = (t_layers + 1) if (t_layers is not None and t.arch in LAST_LAYER_TAP_ARCHS) else t_layers
        if not taps:
            checks.append(PairCheck("taps", False, "draft has no dflash.target_layers"))
        elif limit is None:
            checks.append(PairCheck("taps", False, f"target has no {printable(t.arch, 40)}.block_count"))
        else:
            bad = [x for x in taps if not 0 <= x < limit]
            checks.append(PairCheck("taps", not bad, f"{list(taps)} vs {t_layers} target blocks"
                                    + (f": {bad} out of range (must be < {limit})" if bad else "")))
        if s is not None:
            checks.append(PairCheck("draft structure", not s.problems, "; ".join(s.problems) or
                                    f"{s.kind}, block {s.block_size}, all required tensors present"))
    if m is not None:
        if m.arch != "clip":
            checks.append(PairCheck("mmproj arch", False, f"{printable(m.arch or '?', 40)} (expected clip)"))
        else:
            width, how = mmproj_width(m)
            if width is None:
                checks.append(PairCheck("mmproj width", None, how))
            else:
                checks.append(PairCheck("mmproj width", width == t_embd, f"{width} from {how}, target {t_embd}"))
    reasons = tuple(f"{c.name}: {c.detail}" for c in checks if c.ok is False)
    return PairVerdict(ok=not reasons, reasons=reasons, checks=tuple(checks), target=t.name,
                       draft=d.name if d else None, mmproj=m.name if m else None)


# ------------------------------------------------------------------ per-tensor diff


@dataclass(frozen=True)
class TensorChange:
    name: str
    a_type: str
    b_type: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    a_bytes: int | None
    b_bytes: int | None


@dataclass(frozen=True)
class TensorDiff:
    a: str
    b: str
    n_a: int
    n_b: int
    identical: tuple[str, ...]  # same type, same element count, same data sha256
    respelled: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # identical but shape written differently
    changed: tuple[TensorChange, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @property
    def summary(self) -> str:
        return (f"{len(self.identical)}/{max(self.n_a, self.n_b)} identical, {len(self.changed)} changed, "
                f"{len(self.only_a)} only in A, {len(self.only_b)} only in B")


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x for x in shape if x != 1) or (1,)


def diff_tensors(a: GGUFHeader, a_hashes: FileHashes, b: GGUFHeader, b_hashes: FileHashes) -> TensorDiff:
    """Every tensor's data region compared by sha256; (2304, 1) and (2304) count as the same shape."""
    ta, tb = a.tensor_map(), b.tensor_map()
    identical, respelled, changed = [], [], []
    for name, x in ta.items():
        y = tb.get(name)
        if y is None:
            continue
        same = (x.type_id == y.type_id and x.n_elements == y.n_elements and _squeeze(x.shape) == _squeeze(y.shape)
                and a_hashes.tensors.get(name) is not None and a_hashes.tensors.get(name) == b_hashes.tensors.get(name))
        if same:
            identical.append(name)
            if x.shape != y.shape:
                respelled.append((name, x.shape, y.shape))
        else:
            changed.append(TensorChange(name, x.type_name, y.type_name, x.shape, y.shape, x.n_bytes, y.n_bytes))
    return TensorDiff(a=a.name, b=b.name, n_a=len(ta), n_b=len(tb), identical=tuple(identical),
                      respelled=tuple(respelled), changed=tuple(changed),
                      only_a=tuple(n for n in ta if n not in tb), only_b=tuple(n for n in tb if n not in ta))


# ------------------------------------------------------------------ memory estimate


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


def kv_cache_estimate(h: GGUFHeader, kv_type: str = "f16") -> KVCacheEstimate | None:
    """llama-style K/V bytes per context token: n_kv_layers x n_head_kv x (k_len + v_len) x bytes."""
    if _role(h) == "mmproj":
        return None
    arch = h.arch
    n_layer = _int(h.arch_key("block_count"))
    if not n_layer:
        return None
    per_elem = KV_TYPE_BYTES[kv_type]
    notes: list[str] = []
    if arch in RECURRENT_ARCHS:
        return KVCacheEstimate(n_layer, 0, 0, 0, 0, per_elem, 0, "0 (recurrent: a fixed state per sequence)",
                               ("recurrent arch: the state does not grow with context",))
    heads_kv_raw = h.arch_key("attention.head_count_kv")
    n_head = _int(h.arch_key("attention.head_count")) or 0
    head_dim = _head_dim(h) or 0
    k_len = _int(h.arch_key("attention.key_length")) or head_dim
    v_len = _int(h.arch_key("attention.value_length")) or head_dim
    if isinstance(heads_kv_raw, GGUFArray) and heads_kv_raw.items:
        per_layer = list(_ints(heads_kv_raw))[:n_layer]
        kv_layers = [x for x in per_layer if x > 0]
        n_kv_layers, n_head_kv = len(kv_layers), max(kv_layers, default=0)
        total_heads = sum(kv_layers)
        if n_kv_layers < n_layer:
            notes.append(f"hybrid: {n_kv_layers} of {n_layer} layers are attention layers (per-layer head_count_kv)")
    else:
        n_head_kv = _int(heads_kv_raw) or n_head
        interval = _int(h.arch_key("full_attention_interval"))
        n_kv_layers = n_layer // interval if interval else n_layer
        if interval:
            notes.append(f"hybrid: every {interval}th layer is full attention ({n_kv_layers} of {n_layer})")
        total_heads = n_kv_layers * n_head_kv
    if arch in HYBRID_ARCHS or arch in RECURRENT_ARCHS:
        notes.append("recurrent layers add a fixed per-sequence state, not counted here")
    if h.arch_key("attention.sliding_window") is not None:
        notes.append(f"sliding-window layers keep at most {_int(h.arch_key('attention.sliding_window'))} tokens; "
                     "this counts every layer at full context")
    per_token = int(total_heads * (k_len + v_len) * per_elem)
    if k_len == v_len:
        formula = f"{n_kv_layers} layers x 2 x {n_head_kv} kv heads x {k_len} head dim x {per_elem:g} B = {per_token} B"
    else:
        formula = (f"{n_kv_layers} layers x {n_head_kv} kv heads x ({k_len} + {v_len}) x {per_elem:g} B "
                   f"= {per_token} B")
    return KVCacheEstimate(n_layer, n_kv_layers, n_head_kv, k_len, v_len, per_elem, per_token,
                           formula, tuple(notes))


def memory_estimate(h: GGUFHeader, ctx: int, kv_type: str = "f16") -> MemoryEstimate:
    if ctx <= 0:
        raise UsageError(f"-c must be a positive context size, got {ctx}")
    c = gguf_census.census(h)
    weights = {r.type_name: r.n_bytes for r in c.rows if r.n_bytes is not None}
    kv = kv_cache_estimate(h, kv_type)
    kv_bytes = kv.bytes_per_token * ctx if kv else 0
    return MemoryEstimate(name=h.name, role=_role(h), weights_by_type=weights, weights_bytes=c.tensor_bytes, ctx=ctx,
                          kv=kv, kv_bytes=kv_bytes, total_bytes=c.tensor_bytes + kv_bytes)


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


def _registry_files(pair: Any) -> list[Any]:
    files = [pair.target] + ([pair.mmproj] if pair.mmproj is not None else []) + list(pair.drafts.values())
    return files


def _matches(mf: Any, basename: str) -> bool:
    if mf.filename:
        return mf.filename.rsplit("/", 1)[-1] == basename
    return bool(mf.glob) and fnmatch.fnmatchcase(basename, mf.glob.rsplit("/", 1)[-1])


def find_expected(name: str, basename: str, file_sha256: str | None = None) -> Any:
    """The ModelFile of pair ``name`` (``name:key`` picks a role or draft key) that this file should be."""
    from dsparkcli import registry

    pair_name, _, key = name.partition(":")
    pair = registry.load_registry().get(pair_name)
    files = _registry_files(pair)
    if key:
        chosen = [f for f in files if f.key == key or f.role == key]
        if not chosen:
            raise UsageError(f"{pair_name} has no file '{printable(key, 40)}' (keys: "
                             f"{', '.join(sorted({f.key for f in files}))})")
        return chosen[0]
    by_name = [f for f in files if _matches(f, basename)]
    if by_name:
        return by_name[0]
    by_hash = [f for f in files if file_sha256 and f.sha256 == file_sha256]
    if by_hash:
        return by_hash[0]
    raise UsageError(f"{printable(basename, 80)} matches none of {pair_name}'s files; name one with "
                     f"--expect {pair_name}:KEY ({', '.join(sorted({f.key for f in files}))})")


def auto_expected(basename: str, file_sha256: str | None = None) -> tuple[str, Any] | None:
    """(pair name, ModelFile) pinning this exact file name (or, when hashed, this sha256); None otherwise."""
    from dsparkcli import registry
    from dsparkcli.errors import DsparkError

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


def check_expected(h: GGUFHeader, model_file: Any, model: str, file_sha256: str | None,
                   explicit: bool = True) -> ExpectVerdict:
    counts = gguf_census.census(h).counts()
    checks = [
        ExpectCheck("size", None if model_file.size is None else model_file.size == h.file_size,
                    model_file.size, h.file_size),
        ExpectCheck("census", None if not model_file.census else dict(model_file.census) == counts,
                    dict(model_file.census) or None, counts),
        ExpectCheck("sha256", None if model_file.sha256 is None or file_sha256 is None
                    else model_file.sha256 == file_sha256, model_file.sha256, file_sha256),
    ]
    ok = all(c.ok is not False for c in checks)
    return ExpectVerdict(model=model, role=model_file.role, key=model_file.key, pinned_file=model_file.pattern,
                         ok=ok, checks=tuple(checks), explicit=explicit)


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


@dataclass(frozen=True)
class InspectReport:
    files: tuple[FileReport, ...]
    pairing: PairVerdict | None
    diff: TensorDiff | None
    memory_total: int | None = None  # -c with several files: all weights + every KV cache (the draft's n_ctx = the target's)


HashProgress = Callable[[str, int], Callable[[int], None]]  # (name, total bytes) -> per-chunk callback


def _hash(h: GGUFHeader, progress: HashProgress | None) -> FileHashes:
    if h.name.startswith("hf://"):
        raise UsageError(f"{h.name}: --hash and --against need a local file (remote reads stop at the header)")
    cb = progress(h.name, h.file_size) if progress else None
    return gguf_census.hash_file(h.name, h, cb)


def _mmproj_width_text(h: GGUFHeader) -> str | None:
    if _role(h) != "mmproj":
        return None
    width, how = mmproj_width(h)
    return f"width {width} from {how}" if width is not None else how


def _roles(headers: Sequence[GGUFHeader]) -> dict[str, list[GGUFHeader]]:
    roles: dict[str, list[GGUFHeader]] = {"target": [], "draft": [], "mmproj": []}
    for h in headers:
        roles[_role(h)].append(h)
    return roles


def inspect_files(specs: Sequence[str], *, do_hash: bool = False, against: str | None = None,
                  expect: str | None = None, auto_expect: bool = True, ctx: int | None = None, kv_type: str = "f16",
                  progress: HashProgress | None = None, endpoint: str | None = None) -> InspectReport:
    if not specs:
        raise UsageError("give at least one GGUF file")
    if kv_type not in KV_TYPE_BYTES:
        raise UsageError(f"unknown KV cache type '{printable(kv_type, 20)}' (one of {', '.join(KV_TYPE_BYTES)})")
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
        reports.append(FileReport(
            spec=specs[i], file_size=h.file_size, version=h.version, alignment=h.alignment, data_offset=h.data_offset,
            n_kv=len(h.kv), summary=summarize(h), census=gguf_census.census(h), structure=dspark_structure(h),
            metadata=metadata_json(h), tensors=h.tensors, file_sha256=fh.file_sha256 if fh else None,
            tensor_sha256=fh.tensors if fh else None,
            hash_mb_per_s=(fh.n_bytes / fh.seconds / 1e6) if fh and fh.seconds > 0 else None,
            memory=memory_estimate(h, ctx, kv_type) if ctx else None, expect=verdict,
            mmproj_width=_mmproj_width_text(h),
        ))
    diff = None
    if other is not None:
        diff = diff_tensors(headers[0], hashes[0], other, _hash(other, progress))
    roles = _roles(headers)
    pairing = None
    # exactly one target with one draft and/or one mmproj is a pair; anything else is a list of files
    n_target, n_draft, n_mmproj = len(roles["target"]), len(roles["draft"]), len(roles["mmproj"])
    if n_target == 1 and n_draft <= 1 and n_mmproj <= 1 and n_draft + n_mmproj >= 1:
        pairing = check_pair(roles["target"][0], roles["draft"][0] if n_draft else None,
                             roles["mmproj"][0] if n_mmproj else None)
    memory_total = sum(f.memory.total_bytes for f in reports if f.memory) if ctx and len(reports) > 1 else None
    return InspectReport(files=tuple(reports), pairing=pairing, diff=diff, memory_total=memory_total)
