"""Full-width synthetic pairs: random weights at a real model's shapes, for throughput work.

Nothing here knows a right answer: the weights are random, so acceptance must be emulated with
llama-server's ``--spec-synth-len``. What is real is every tensor shape, the quantised type and the
graph llama.cpp runs, so step costs, memory traffic and load times are those of the real pair.

The target for ``minicpm-v-4.7-35b-a3b`` is the MiniCPM-V-4.7-35B-A3B text tower written as arch
``qwen35moe`` (the arch its Qwen3.5-35B-A3B language model uses in llama.cpp: 40 layers, 3 of 4
gated-delta-net recurrent, MoE 256 experts x FF 512, 8 routed + 1 shared). ``qwen3moe`` (plain
attention, no shared expert) is offered as a stand-in to isolate the cost of recurrent checkpoints.

The shapes are ``synth.real_shapes``'; here are the tensors and metadata of each file and the pair's
manifest. Files are streamed by ``synth.gguf_stream.write_gguf``: a ~37 GB target needs a few MB of RAM.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dsparkcli import __version__
from dsparkcli.errors import UsageError
from dsparkcli.outputs import check_output_dir, check_output_file
from dsparkcli.synth.gguf_stream import QTYPES, ProgressFn, TensorSpec, write_gguf
from dsparkcli.synth.real_shapes import ARCH_REASON, DraftShape, TargetShape, shapes_for


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


# ------------------------------------------------------------------ tensor plans


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
            (f"{a}.rope.section_order", "str", "zyxt"),  # MiniCPM-V 4.7's M-RoPE stream order (issue 31)
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
    "FullWidthPair",
    "read_manifest",
    "measurement_pair",
    "is_recurrent",
    "target_tensors",
    "draft_tensors",
    "target_kv",
    "draft_kv",
    "param_counts",
    "write_full_width",
]
