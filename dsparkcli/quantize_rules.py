"""What llama-quantize (llama.cpp 0c1e570, src/llama-quant.cpp) does to a tensor, written down so `dspark requant`
can refuse before it runs: the types a user may ask for and their canonical names, the positional file types
that honour a per-tensor type map, the tensors it never converts, the block fallbacks it takes silently, and
the anchored pattern that matches one tensor name in its type map."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from dsparkcli.errors import UsageError
from dsparkcli.gguf.reader import ggml_types

# Targets a user may ask for: the ones llama-quantize converts to without an importance matrix and that
# every backend dspark cares about can run. Canonical spelling is gguf-py's (GGMLQuantizationType names).
TARGET_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0")
# Positional file types whose base type is quantised (llama_ftype_get_default_type): the map is honoured.
QUANTISED_FTYPES = {"Q8_0": 7, "Q6_K": 18, "Q5_K": 17, "Q5_1": 9, "Q5_0": 8, "Q4_K": 15, "Q4_1": 3, "Q4_0": 2}
IGNORING_FTYPES = ("COPY", "F32", "F16", "BF16")  # base type not quantised: --tensor-type-file is ignored

# tensor_allows_quantization (llama-quant.cpp): name fragments llama-quantize never converts.
_NEVER_QUANTISED = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_NEVER_QUANTISED_EXACT = ("position_embd.weight", "token_types.weight")
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}")


@functools.cache
def _by_lower() -> dict[str, tuple[int, str]]:
    return {entry[0].lower(): (tid, entry[0]) for tid, entry in ggml_types().items()}


def canonical_type(name: str) -> str:
    """'q6_k' / 'Q6_K' / 'q6_K' -> 'Q6_K'; UsageError for anything not in TARGET_TYPES."""
    found = _by_lower().get(name.strip().lower())
    if found is None or found[1] not in TARGET_TYPES:
        raise UsageError(
            f"unsupported tensor type {name!r}; choose one of {', '.join(t.lower() for t in TARGET_TYPES)}"
        )
    return found[1]


def known_type(name: str) -> bool:
    """Whether ggml has a type of this name, any spelling."""
    return name.lower() in _by_lower()


def type_id(name: str) -> int:
    return _by_lower()[name.lower()][0]


def block_of(name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type."""
    _, block, size = ggml_types()[type_id(name)]
    return block, size


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count ({2304, 1} is 1-D)."""
    for i in range(len(shape) - 1, 0, -1):
        if shape[i] > 1:
            return i + 1
    return 1


def squeeze(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape without its trailing dimensions of 1."""
    return tuple(shape[: n_dims(shape)]) if shape else (1,)


def never_quantised_reason(name: str, shape: Sequence[int]) -> str | None:
    """Why llama-quantize keeps this tensor in its stored type whatever the map says (None: it converts it)."""
    if n_dims(shape) < 2:
        return "1-D tensors"
    if not name.endswith("weight"):
        return "tensors whose name does not end in 'weight'"
    if "_norm.weight" in name:
        return "norm weights (*_norm.weight)"
    if name in _NEVER_QUANTISED_EXACT or any(frag in name for frag in _NEVER_QUANTISED):
        return "this tensor (a name rule in llama-quant.cpp)"
    return None


def fallback_type(target: str, row: int) -> str | None:
    """tensor_type_fallback: the type llama-quantize silently uses instead of ``target``, None if it fits."""
    block, _ = block_of(target)
    if row % block == 0:
        return None
    if target == "Q6_K" and row % 32 == 0:
        return "Q8_0"
    if target in ("Q4_K", "Q5_K") and row % 32 == 0:
        return {"Q4_K": "Q5_0", "Q5_K": "Q5_1"}[target]
    return "F16"


def map_pattern(name: str) -> str:
    """An anchored regex matching exactly ``name`` (llama-quantize regex_search-es every pattern)."""
    return "^" + "".join("\\" + c if c in _REGEX_SPECIAL else c for c in name) + "$"
