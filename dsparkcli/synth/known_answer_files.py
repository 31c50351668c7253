"""The files of a known-answer pair, weights scripted from its maps (the construction is ``known_answer``'s
docstring): the ``llama`` target (one-hot embeddings, zero layers, the permutation ``g`` as its output), the
``dflash`` draft (a zero backbone, ``draft_map`` in its Markov head, the scripted confidence head), the
``mlp`` mmproj and a PNG to show it. gguf-py, numpy and Pillow are imported where a file is written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGET_LAYERS = 2  # the draft taps the inputs of target layers 0 and 1 (layer n_layer would abort)
FFN_WIDTH = 64  # weights are zero; any non-zero width loads
HEAD_DIM = 64  # keeps GPU flash-attention kernels usable
CONTEXT_LENGTH = 4096
RMS_EPS = 1e-5

# The confidence head's bias b: slot i's logit is c[prev_i] + b (c: known_answer.CONF_LOGITS).
CONF_BIAS = 0.5

# mmproj: 32x32 image, 16x16 patches -> 4 image embeddings, no ViT blocks (clip projector "mlp").
MMPROJ_IMAGE_SIZE = 32
MMPROJ_PATCH = 16
MMPROJ_WIDTH = 32
MMPROJ_HIDDEN = 64


def _tokenizer(writer: Any, vocab: int) -> None:
    writer.add_tokenizer_model("test")
    writer.add_token_list([f"t{i}" for i in range(vocab)])  # unique, none looks like an EOG marker


def _write(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_target(path: Path, vocab: int, n_embd: int, g: Sequence[int], n_layer: int = TARGET_LAYERS) -> None:
    import gguf
    import numpy as np  # deferred: only writers need numpy

    n_head = n_embd // HEAD_DIM
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("dspark synthetic target")
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(FFN_WIDTH)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    _tokenizer(w, vocab)
    f32 = np.float32
    embd = np.zeros((vocab, n_embd), f32)
    embd[np.arange(vocab), np.arange(vocab)] = 1.0  # one-hot: hidden state = the token itself
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, f32))
    out = np.zeros((vocab, n_embd), f32)
    out[np.asarray(g), np.arange(vocab)] = 1.0  # logits peak at g(t)
    w.add_tensor("output.weight", out)
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, f32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):  # attn_output = 0: the layer adds nothing
            w.add_tensor(p + name + ".weight", np.zeros((n_embd, n_embd), f32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, f32))
        w.add_tensor(p + "ffn_gate.weight", np.zeros((FFN_WIDTH, n_embd), f32))
        w.add_tensor(p + "ffn_up.weight", np.zeros((FFN_WIDTH, n_embd), f32))
        w.add_tensor(p + "ffn_down.weight", np.zeros((n_embd, FFN_WIDTH), f32))  # = 0
    _write(w)


def write_draft(
    path: Path, vocab: int, n_embd: int, block_size: int, draft_map: Sequence[int], conf_logits: Sequence[float] | None
) -> None:
    import gguf
    import numpy as np  # deferred: only writers need numpy

    n_head = n_embd // HEAD_DIM
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name("dspark synthetic draft")
    a = "dflash"
    w.add_uint32(f"{a}.context_length", CONTEXT_LENGTH)
    w.add_uint32(f"{a}.embedding_length", n_embd)
    w.add_uint32(f"{a}.block_count", 1)
    w.add_uint32(f"{a}.feed_forward_length", FFN_WIDTH)
    w.add_uint32(f"{a}.attention.head_count", n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", n_head)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", RMS_EPS)
    w.add_array(f"{a}.target_layers", list(range(TARGET_LAYERS)))
    w.add_uint32(f"{a}.block_size", block_size)
    w.add_bool(f"{a}.sample_from_anchor", True)
    w.add_bool(f"{a}.has_confidence_head", conf_logits is not None)
    _tokenizer(w, vocab)
    w.add_mask_token_id(vocab - 1)
    f32 = np.float32
    nt = TARGET_LAYERS
    w.add_tensor("fc.weight", np.zeros((n_embd, nt * n_embd), f32))
    w.add_tensor("enc.output_norm.weight", np.ones(n_embd, f32))
    w.add_tensor("output_norm.weight", np.zeros(n_embd, f32))  # backbone logits exactly 0
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, f32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, f32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(p + name + ".weight", np.zeros((n_embd, n_embd), f32))
    w.add_tensor(p + "attn_q_norm.weight", np.ones(HEAD_DIM, f32))
    w.add_tensor(p + "attn_k_norm.weight", np.ones(HEAD_DIM, f32))
    w.add_tensor(p + "ffn_gate.weight", np.zeros((FFN_WIDTH, n_embd), f32))
    w.add_tensor(p + "ffn_up.weight", np.zeros((FFN_WIDTH, n_embd), f32))
    w.add_tensor(p + "ffn_down.weight", np.zeros((n_embd, FFN_WIDTH), f32))
    w.add_tensor("markov_w1.weight", np.eye(vocab, dtype=f32))  # rank R = vocab, w1[prev] = one_hot(prev)
    w2 = np.zeros((vocab, vocab), f32)
    w2[np.asarray(draft_map), np.arange(vocab)] = 1.0  # bias = one_hot(draft_map[prev])
    w.add_tensor("markov_w2.weight", w2)
    if conf_logits is not None:
        proj = np.zeros((1, n_embd + vocab), f32)  # [t_embd (= 0) ; w1[prev]] -> c[prev]
        proj[0, n_embd:] = np.asarray(conf_logits, f32) - CONF_BIAS
        w.add_tensor("conf_proj.weight", proj)
        w.add_tensor("conf_proj.bias", np.full(1, CONF_BIAS, f32))
    _write(w)


def write_mmproj(path: Path, n_embd: int, seed: int) -> None:
    import gguf
    import numpy as np  # deferred: only writers need numpy

    rng = np.random.default_rng([seed, 2])
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_name("dspark synthetic mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.embedding_length", MMPROJ_WIDTH)
    w.add_uint32("clip.vision.feed_forward_length", MMPROJ_HIDDEN)
    w.add_uint32("clip.vision.block_count", 0)
    w.add_uint32("clip.vision.projection_dim", n_embd)
    w.add_uint32("clip.vision.attention.head_count", 1)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.image_size", MMPROJ_IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", MMPROJ_PATCH)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    f32 = np.float32
    n_patch = (MMPROJ_IMAGE_SIZE // MMPROJ_PATCH) ** 2

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(f32)

    w.add_tensor("v.patch_embd.weight", rand(MMPROJ_WIDTH, 3, MMPROJ_PATCH, MMPROJ_PATCH))
    w.add_tensor("v.patch_embd.bias", rand(MMPROJ_WIDTH))
    w.add_tensor("v.position_embd.weight", rand(n_patch, MMPROJ_WIDTH))
    w.add_tensor("mm.0.weight", rand(MMPROJ_HIDDEN, MMPROJ_WIDTH))
    w.add_tensor("mm.0.bias", rand(MMPROJ_HIDDEN))
    w.add_tensor("mm.2.weight", rand(n_embd, MMPROJ_HIDDEN))  # output width must equal the target's n_embd
    w.add_tensor("mm.2.bias", rand(n_embd))
    _write(w)


def write_png(path: Path, seed: int) -> None:
    import numpy as np  # deferred: only writers need numpy
    from PIL import Image

    rng = np.random.default_rng([seed, 3])
    Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8), "RGB").save(path, format="PNG")
