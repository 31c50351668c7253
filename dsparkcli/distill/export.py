"""Write a trained DSparkDraft as the GGUF llama.cpp 0c1e570 loads (arch ``dflash``, DSpark tensors).

Shapes are numpy order (= reversed ggml ``ne``); see the key/tensor table in src/models/dflash.cpp. The
draft borrows the target's token table and head (no ``token_embd``/``output`` in the file), carries the
target's tokenizer verbatim (llama.cpp loads a vocab for every model) plus a mask token, and records
where it came from under ``dspark.distill.*``. The file is written beside the destination and renamed
into place, so a failure or Ctrl-C never leaves half a GGUF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from dsparkcli.distill.model import DraftConfig, DSparkDraft
from dsparkcli.distill.target import TargetTokenizer

ARCH = "dflash"
OUT_TYPES = ("f32", "f16", "q8_0")


def tensors(draft: DSparkDraft) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array, in the engine's names."""

    def a(t: Any) -> np.ndarray:
        return t.detach().float().cpu().numpy().astype(np.float32)

    out = {
        "fc.weight": a(draft.fc.weight),
        "enc.output_norm.weight": a(draft.hidden_norm.weight),
        "output_norm.weight": a(draft.norm.weight),
        "markov_w1.weight": a(draft.markov_w1.weight),  # [V, R] = ggml {R, V}: get_rows by token
        "markov_w2.weight": a(draft.markov_w2.weight),  # [V, R] = ggml {R, V}: mul_mat -> [V]
        "conf_proj.weight": a(draft.conf.weight),  # [1, E+R]: [t_embd ; w1[prev]]
        "conf_proj.bias": a(draft.conf.bias),
    }
    for i, layer in enumerate(draft.layers):
        p = f"blk.{i}."
        out.update(
            {
                p + "attn_norm.weight": a(layer.attn_norm.weight),
                p + "attn_q.weight": a(layer.wq.weight),
                p + "attn_k.weight": a(layer.wk.weight),
                p + "attn_v.weight": a(layer.wv.weight),
                p + "attn_output.weight": a(layer.wo.weight),
                p + "attn_q_norm.weight": a(layer.q_norm.weight),
                p + "attn_k_norm.weight": a(layer.k_norm.weight),
                p + "ffn_norm.weight": a(layer.ffn_norm.weight),
                p + "ffn_gate.weight": a(layer.gate.weight),
                p + "ffn_up.weight": a(layer.up.weight),
                p + "ffn_down.weight": a(layer.down.weight),
            }
        )
    return out


def _add_tokenizer(w: Any, tok: TargetTokenizer, mask_token_id: int) -> None:
    w.add_tokenizer_model(tok.model)
    if tok.pre:
        w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    if tok.token_types is not None:
        w.add_token_types(list(tok.token_types))
    if tok.merges:
        w.add_token_merges(list(tok.merges))
    if tok.scores is not None:
        w.add_token_scores(tok.scores)
    for name, tid in tok.special.items():
        w.add_uint32(f"tokenizer.ggml.{name}_token_id", tid)
    w.add_mask_token_id(mask_token_id)


def write_gguf(
    path: Path,
    draft: DSparkDraft,
    tok: TargetTokenizer,
    outtype: str = "q8_0",
    provenance: dict[str, Any] | None = None,
) -> None:
    if outtype not in OUT_TYPES:
        raise ValueError(f"outtype must be one of {OUT_TYPES}")
    c = draft.cfg
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), ARCH)
    try:
        w.add_name("dspark distilled draft")
        w.add_uint32(f"{ARCH}.context_length", c.context_length)
        w.add_uint32(f"{ARCH}.embedding_length", c.n_embd)
        w.add_uint32(f"{ARCH}.block_count", c.n_layer)
        w.add_uint32(f"{ARCH}.feed_forward_length", c.n_ff)
        w.add_uint32(f"{ARCH}.attention.head_count", c.n_head)
        w.add_uint32(f"{ARCH}.attention.head_count_kv", c.n_head_kv)
        w.add_uint32(f"{ARCH}.attention.key_length", c.head_dim)
        w.add_uint32(f"{ARCH}.attention.value_length", c.head_dim)
        w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", c.eps)
        w.add_float32(f"{ARCH}.rope.freq_base", c.rope_base)
        w.add_uint32(f"{ARCH}.rope.dimension_count", c.head_dim)
        w.add_array(f"{ARCH}.target_layers", [int(x) for x in c.taps])
        w.add_uint32(f"{ARCH}.block_size", c.block_size)
        w.add_bool(f"{ARCH}.sample_from_anchor", True)
        w.add_bool(f"{ARCH}.has_confidence_head", True)
        w.add_bool(f"{ARCH}.attention.causal", True)  # block slots see earlier slots only (model.py)
        _add_tokenizer(w, tok, c.mask_token_id)
        w.add_string("dspark.distill.config", json.dumps(c.to_dict(), sort_keys=True))
        for k, v in (provenance or {}).items():
            w.add_string(f"dspark.distill.{k}", v if isinstance(v, str) else json.dumps(v, sort_keys=True))
        for name, arr in tensors(draft).items():
            if arr.ndim == 1 or outtype == "f32":
                w.add_tensor(name, arr)
            elif outtype == "f16":
                w.add_tensor(name, arr.astype(np.float16))
            else:
                q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


def read_gguf(path: Path) -> DSparkDraft:
    """Load a draft this module wrote (any outtype) back into torch: for parity checks and evaluation."""
    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("dspark.distill.config")
    if field is None:
        raise ValueError(f"{path} was not written by dspark distill (no dspark.distill.config)")
    draft = DSparkDraft(DraftConfig.from_dict(json.loads(field.contents())))
    names = {v: k for k, v in _state_names(draft).items()}
    state = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        state[names[t.name]] = torch.from_numpy(np.array(arr, dtype=np.float32).reshape(shape))
    draft.load_state_dict(state)
    return draft


def _state_names(draft: DSparkDraft) -> dict[str, str]:
    """torch state_dict key -> GGUF tensor name (the inverse of ``tensors``)."""
    m = {
        "fc.weight": "fc.weight",
        "hidden_norm.weight": "enc.output_norm.weight",
        "norm.weight": "output_norm.weight",
        "markov_w1.weight": "markov_w1.weight",
        "markov_w2.weight": "markov_w2.weight",
        "conf.weight": "conf_proj.weight",
        "conf.bias": "conf_proj.bias",
    }
    per_layer = {
        "attn_norm": "attn_norm",
        "wq": "attn_q",
        "wk": "attn_k",
        "wv": "attn_v",
        "wo": "attn_output",
        "q_norm": "attn_q_norm",
        "k_norm": "attn_k_norm",
        "ffn_norm": "ffn_norm",
        "gate": "ffn_gate",
        "up": "ffn_up",
        "down": "ffn_down",
    }
    for i in range(len(draft.layers)):
        for a, b in per_layer.items():
            m[f"layers.{i}.{a}.weight"] = f"blk.{i}.{b}.weight"
    return m
