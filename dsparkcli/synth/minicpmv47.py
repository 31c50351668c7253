"""A MiniCPM-V 4.7-shaped stand-in: target, mmproj and DSpark draft with random weights.

The files carry the facts a 4.7 release has (issue 31): the text GGUF is ``qwen35moe`` with the key
``qwen35moe.rope.section_order`` (``zyxt`` or ``tyxz``); the mmproj declares
``clip.projector_type = "minicpmv4_7"`` (the 4.6 vision graph: SigLIP ViT, window-attention merger,
final 2x2 merger) with no ``clip.minicpmv_version``, plus ``v.tok_embd_sep`` whose rows are the text
embeddings of ``</image>``, ``<slice>``, ``</slice>`` and ``\\n``, copied from the target's
``token_embd`` as upstream's converter does. The tokenizer is a byte-level BPE (arch-independent,
loads in any llama.cpp) holding the special tokens mtmd looks up for MiniCPM-V.

``scale="small"`` writes widths a CPU test runs in a second (the target ~2 MB, the mmproj ~4 MB);
``scale="full"`` the real widths (35B-A3B text tower, SigLIP-400M vision tower) for the H200.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dsparkcli import __version__
from dsparkcli.errors import UsageError
from dsparkcli.outputs import check_output_dir, check_output_file
from dsparkcli.synth import full_width

if TYPE_CHECKING:
    import numpy as np

SHAPE = "minicpm-v-4.7"
SCALES = ("small", "full")
SECTION_ORDERS = ("zyxt", "tyxz")
PROJECTOR = "minicpmv4_7"
# the rows of v.tok_embd_sep, in the converter's order
SEP_TOKENS = ("</image>", "<slice>", "</slice>", "\n")
# specials mtmd looks up for MiniCPM-V, and the chat template's
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "</image>", "<slice>", "</slice>", "<unk>")


@dataclass(frozen=True)
class VisionShape:
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    patch_size: int
    image_size: int
    scale_factor: int  # clip.vision.projector.scale_factor: 4 = ViT merger + final merger
    insert_layer: int  # clip.vision.wa_layer_indexes[0]: the ViT merger follows this layer
    merger_ff: int  # ViT merger's downsample MLP hidden width
    proj_ff: int  # final merger's hidden width
    max_slice_nums: int


@dataclass(frozen=True)
class Stand47:
    target: Path
    mmproj: Path
    draft: Path
    manifest: Path


_SMALL_VISION = VisionShape(
    n_embd=64,
    n_ff=128,
    n_layer=2,
    n_head=2,
    patch_size=14,
    image_size=112,
    scale_factor=4,
    insert_layer=0,
    merger_ff=128,
    proj_ff=256,
    max_slice_nums=9,
)
# SigLIP-400M as MiniCPM-V 4.x ships it (the merger widths are this stand-in's assumption)
_FULL_VISION = VisionShape(
    n_embd=1152,
    n_ff=4304,
    n_layer=27,
    n_head=16,
    patch_size=14,
    image_size=448,
    scale_factor=4,
    insert_layer=12,
    merger_ff=4608,
    proj_ff=4096,
    max_slice_nums=9,
)


# ------------------------------------------------------------------ tokenizer


def _byte_pieces() -> list[str]:
    """GPT-2's byte-to-unicode map: the 256 single-byte pieces of a byte-level BPE."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    types: tuple[int, ...]  # llama.cpp token types: 1 normal, 3 control, 5 unused
    merges: tuple[str, ...]

    def id_of(self, text: str) -> int:
        """The id a text piece has (a special as written, a byte as its byte-level piece)."""
        if text in SPECIAL_TOKENS:
            return self.tokens.index(text)
        (piece,) = [_byte_pieces()[b] for b in text.encode()]
        return self.tokens.index(piece)


def byte_vocab(size: int) -> Vocab:
    """Bytes, one merge ("Ġ t"), the specials, then unused fillers up to ``size``."""
    pieces = _byte_pieces() + ["Ġt"]
    types = [1] * len(pieces)
    pieces += list(SPECIAL_TOKENS)
    types += [3] * len(SPECIAL_TOKENS)
    if size < len(pieces):
        raise UsageError(f"vocab {size} is below the {len(pieces)} tokens the tokenizer needs")
    n_fill = size - len(pieces)
    pieces += [f"<|fill_{i}|>" for i in range(n_fill)]
    types += [5] * n_fill
    return Vocab(tuple(pieces), tuple(types), ("Ġ t",))


def tokenizer_kv(vocab: Vocab) -> list[tuple[str, str, object]]:
    eot = vocab.tokens.index("<|im_end|>")
    return [
        ("tokenizer.ggml.model", "str", "gpt2"),
        ("tokenizer.ggml.pre", "str", "qwen35"),
        ("tokenizer.ggml.tokens", "str[]", list(vocab.tokens)),
        ("tokenizer.ggml.token_type", "i32[]", list(vocab.types)),
        ("tokenizer.ggml.merges", "str[]", list(vocab.merges)),
        ("tokenizer.ggml.bos_token_id", "u32", vocab.tokens.index("<|endoftext|>")),
        ("tokenizer.ggml.eos_token_id", "u32", eot),
        ("tokenizer.ggml.padding_token_id", "u32", vocab.tokens.index("<|endoftext|>")),
        ("tokenizer.ggml.add_bos_token", "bool", False),
    ]


def _with_tokenizer(kv: list[tuple[str, str, object]], vocab: Vocab) -> list[tuple[str, str, object]]:
    return [e for e in kv if not e[0].startswith("tokenizer.")] + tokenizer_kv(vocab)


# ------------------------------------------------------------------ shapes


def shapes(scale: str) -> tuple[full_width.TargetShape, full_width.DraftShape, VisionShape]:
    if scale not in SCALES:
        raise UsageError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    if scale == "full":
        t, d = full_width.shapes_for("minicpm-v-4.7-35b-a3b", scale=1.0, target_arch="qwen35moe")
        return t, d, _FULL_VISION
    t, d = full_width.shapes_for("minicpm-v-4.7-35b-a3b", scale=0.05, target_arch="qwen35moe")
    # 4 layers (3 gated-delta-net, 1 full attention), a 512-token vocab: loads and runs in well under a second
    t = replace(t, n_layer=4, vocab=512, ctx=4096)
    d = replace(d, n_layer=1, vocab=512, mask_token_id=511, target_layers=(1, 3), markov_rank=32, ctx=4096)
    return t, d, _SMALL_VISION


def target_kv(t: full_width.TargetShape, vocab: Vocab, section_order: str) -> list[tuple[str, str, object]]:
    name = ("general.name", "str", f"dspark {SHAPE} stand-in (random weights)")
    kv = [
        name if k == "general.name" else (k, kind, v) for k, kind, v in _with_tokenizer(full_width.target_kv(t), vocab)
    ]
    order = f"{t.arch}.rope.section_order"  # full_width writes zyxt: this stand-in's own order replaces it
    return [e for e in kv if e[0] != order] + [(order, "str", section_order)]


# ------------------------------------------------------------------ mmproj


def _token_rows(target_path: Path, ids: list[int]) -> np.ndarray:
    """Rows of the target's token_embd, dequantised to F32 (what the converter copies)."""
    import gguf

    reader = gguf.GGUFReader(target_path)
    (embd,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    # pick the rows first: the full-width table is 248k rows
    return gguf.quants.dequantize(embd.data[ids], embd.tensor_type).astype("float32")


def mmproj_tensors(v: VisionShape, n_embd_text: int, seed: int) -> dict[str, np.ndarray]:
    """The minicpmv4_7 (= 4.6 graph) vision tower; numpy shapes (ggml's ne reversed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    E, dt = v.n_embd, np.float32 if v.n_embd <= 256 else np.float16

    def lin(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(dt)

    def vec(n: int, mean: float = 0.0, sd: float = 0.02) -> np.ndarray:
        return (mean + sd * rng.standard_normal(n)).astype(np.float32)

    p = v.patch_size
    ts: dict[str, np.ndarray] = {
        "v.patch_embd.weight": (rng.standard_normal((E, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32),
        "v.patch_embd.bias": vec(E),
        "v.position_embd.weight": (0.1 * rng.standard_normal((70 * 70, E))).astype(np.float32),
        "v.post_ln.weight": vec(E, 1.0),
        "v.post_ln.bias": vec(E),
    }
    for il in range(v.n_layer):
        b = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            ts[b + name + ".weight"], ts[b + name + ".bias"] = lin(E, E), vec(E)
        ts[b + "ln1.weight"], ts[b + "ln1.bias"] = vec(E, 1.0), vec(E)
        ts[b + "ln2.weight"], ts[b + "ln2.bias"] = vec(E, 1.0), vec(E)
        ts[b + "ffn_up.weight"], ts[b + "ffn_up.bias"] = lin(v.n_ff, E), vec(v.n_ff)
        ts[b + "ffn_down.weight"], ts[b + "ffn_down.bias"] = lin(E, v.n_ff), vec(E)
    m = "v.vit_merger."
    ts[m + "ln1.weight"], ts[m + "ln1.bias"] = vec(E, 1.0), vec(E)
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        ts[m + name + ".weight"], ts[m + name + ".bias"] = lin(E, E), vec(E)
    ts[m + "ds_ln.weight"], ts[m + "ds_ln.bias"] = vec(4 * E, 1.0), vec(4 * E)
    ts[m + "ds_ffn_up.weight"], ts[m + "ds_ffn_up.bias"] = lin(v.merger_ff, 4 * E), vec(v.merger_ff)
    ts[m + "ds_ffn_down.weight"], ts[m + "ds_ffn_down.bias"] = lin(E, v.merger_ff), vec(E)
    ts["mm.input_norm.weight"], ts["mm.input_norm.bias"] = vec(4 * E, 1.0), vec(4 * E)
    ts["mm.up.weight"], ts["mm.up.bias"] = lin(v.proj_ff, 4 * E), vec(v.proj_ff)
    ts["mm.down.weight"], ts["mm.down.bias"] = lin(n_embd_text, v.proj_ff), vec(n_embd_text)
    return ts


def mmproj_kv(v: VisionShape, n_embd_text: int) -> list[tuple[str, str, object]]:
    return [
        ("general.name", "str", f"dspark {SHAPE} stand-in mmproj (random weights)"),
        ("clip.has_vision_encoder", "bool", True),
        ("clip.projector_type", "str", PROJECTOR),
        ("clip.use_gelu", "bool", True),
        ("clip.vision.embedding_length", "u32", v.n_embd),
        ("clip.vision.feed_forward_length", "u32", v.n_ff),
        ("clip.vision.block_count", "u32", v.n_layer),
        ("clip.vision.attention.head_count", "u32", v.n_head),
        ("clip.vision.attention.layer_norm_epsilon", "f32", 1e-6),
        ("clip.vision.projection_dim", "u32", n_embd_text),
        ("clip.vision.image_size", "u32", v.image_size),
        ("clip.vision.patch_size", "u32", v.patch_size),
        ("clip.vision.image_mean", "f32[]", [0.5, 0.5, 0.5]),
        ("clip.vision.image_std", "f32[]", [0.5, 0.5, 0.5]),
        ("clip.vision.projector.scale_factor", "u32", v.scale_factor),
        ("clip.vision.max_slice_nums", "u32", v.max_slice_nums),
        ("clip.vision.wa_layer_indexes", "i32[]", [v.insert_layer]),
    ]


def write_mmproj(path: Path, v: VisionShape, target_path: Path, vocab: Vocab, n_embd_text: int, seed: int) -> Path:
    import gguf

    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(tmp, "clip")
    for key, kind, value in mmproj_kv(v, n_embd_text):
        if kind == "str":
            w.add_string(key, value)  # type: ignore[arg-type]
        elif kind == "bool":
            w.add_bool(key, value)  # type: ignore[arg-type]
        elif kind == "u32":
            w.add_uint32(key, value)  # type: ignore[arg-type]
        elif kind == "f32":
            w.add_float32(key, value)  # type: ignore[arg-type]
        elif kind == "f32[]":
            w.add_array(key, value)  # type: ignore[arg-type]
        elif kind == "i32[]":
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)  # type: ignore[arg-type]
    for name, data in mmproj_tensors(v, n_embd_text, seed).items():
        w.add_tensor(name, data)
    w.add_tensor("v.tok_embd_sep", _token_rows(target_path, [vocab.id_of(t) for t in SEP_TOKENS]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


# ------------------------------------------------------------------ the stand-in


def image_rgb(width: int, height: int, seed: int) -> bytes:
    """A smooth random RGB image, row-major bytes (what mtmd_bitmap_init takes)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    img = np.stack([np.sin(6.3 * (xx * rng.uniform(1, 3) + yy * rng.uniform(1, 3)) + k) for k in range(3)], -1)
    return ((img * 0.5 + 0.5) * 255).astype(np.uint8).tobytes()


def write_png(path: Path, width: int, height: int, seed: int) -> Path:
    """``image_rgb`` as a PNG (PIL-free: zlib + the PNG chunk format)."""
    import struct
    import zlib

    rgb, stride = image_rgb(width, height, seed), 3 * width
    raw = b"".join(b"\0" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    path.write_bytes(png)
    return path


def write_standin(
    outdir: Path | str, *, scale: str = "small", section_order: str = "zyxt", qtype: str = "Q8_0", seed: int = 0
) -> Stand47:
    """Write target, mmproj, draft and a manifest (``manifest-minicpm-v-4.7-<scale>.json``) into ``outdir``."""
    if section_order not in SECTION_ORDERS:
        raise UsageError(f"unknown rope section order {section_order!r}; choose one of {', '.join(SECTION_ORDERS)}")
    if qtype not in full_width.QTYPES:
        raise UsageError(f"unsupported qtype {qtype!r}; choose one of {', '.join(full_width.QTYPES)}")
    t, d, v = shapes(scale)
    outdir = check_output_dir(outdir)
    tag = f"{SHAPE}-{scale}-{section_order}-{qtype}"
    paths = {
        "target": outdir / f"target-{tag}.gguf",
        "mmproj": outdir / f"mmproj-{tag}.gguf",
        "draft": outdir / f"draft-dspark-{tag}.gguf",
        "manifest": outdir / f"manifest-{tag}.json",
    }
    for path in paths.values():
        if path.exists() or path.is_symlink():
            check_output_file(path, what="synth output")
    outdir.mkdir(parents=True, exist_ok=True)
    vocab = byte_vocab(t.vocab)
    t_specs, d_specs = full_width.target_tensors(t, qtype), full_width.draft_tensors(d, qtype)
    t_stats = full_width.write_gguf(paths["target"], target_kv(t, vocab, section_order), t_specs, seed=seed)
    d_kv = _with_tokenizer(full_width.draft_kv(d), vocab) + [("tokenizer.ggml.mask_token_id", "u32", d.mask_token_id)]
    d_stats = full_width.write_gguf(paths["draft"], d_kv, d_specs, seed=seed + 1)
    write_mmproj(paths["mmproj"], v, paths["target"], vocab, t.n_embd, seed + 2)
    manifest = {
        "kind": "dspark-minicpm-v-4.7-standin",
        "synthetic": True,
        "note": "random weights: text is meaningless; the files carry MiniCPM-V 4.7's format (issue 31)",
        "dspark_version": __version__,
        "shape": SHAPE,
        "scale": scale,
        "qtype": qtype,
        "seed": seed,
        "rope_section_order": section_order,
        "projector": PROJECTOR,
        "sep_tokens": list(SEP_TOKENS),
        "sep_token_ids": [vocab.id_of(s) for s in SEP_TOKENS],
        "target": {"file": paths["target"].name, "shape": asdict(t), "sha256": t_stats.sha256, "bytes": t_stats.bytes},
        "mmproj": {"file": paths["mmproj"].name, "shape": asdict(v), "bytes": paths["mmproj"].stat().st_size},
        "draft": {"file": paths["draft"].name, "shape": asdict(d), "sha256": d_stats.sha256, "bytes": d_stats.bytes},
    }
    paths["manifest"].write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Stand47(paths["target"], paths["mmproj"], paths["draft"], paths["manifest"])


def read_standin(manifest: Path | str) -> Stand47:
    m, d = json.loads(Path(manifest).read_text(encoding="utf-8")), Path(manifest).parent
    return Stand47(d / m["target"]["file"], d / m["mmproj"]["file"], d / m["draft"]["file"], Path(manifest))
