"""Full-width synthetic pair: real shapes at scale 1, valid files at small scale, and a real
llama-server run where the emulated acceptance (--spec-synth-len) shows up in the counters."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import full_width as ss
from dsparkcli.synth.gguf_stream import TensorSpec, write_gguf
from dsparkcli.synth.real_shapes import shapes_for
from support.scripts import script

# A native build on this AMX CPU segfaulted in ggml_backend_amx_mul_mat on these quantised files
# (qwen35moe and qwen3moe, Q8_0 and Q4_K); the portable x86-64-v3 engine has no AMX path, and
# --no-repack keeps the test valid on either build. The GPU path never uses AMX.
CPU_ARGS = ("--no-repack",)


def test_scale_one_has_the_real_pairs_shapes() -> None:
    t, d = shapes_for("minicpm-v-4.7-35b-a3b")
    # draft: upstream_facts.md (Qwen3DSparkModel)
    assert (d.n_layer, d.n_embd, d.n_head, d.n_head_kv, d.head_dim, d.n_ff) == (5, 2048, 8, 2, 256, 6144)
    assert (d.vocab, d.block_size, d.mask_token_id, d.markov_rank) == (248_144, 15, 248_076, 256)
    assert d.target_layers == (4, 12, 20, 28, 36)  # HF taps 3/11/19/27/35, GGUF writes HF id + 1
    assert d.confidence_head
    d_params = sum(s.n_elements for s in ss.draft_tensors(d, "Q8_0"))
    assert abs(d_params - 389_223_169) / 389_223_169 < 0.001  # the card's parameter count
    # target: 40 layers, hidden 2048, 35 B total / ~3 B active, vocab 248144
    assert (t.arch, t.n_layer, t.n_embd, t.vocab, t.n_expert, t.n_expert_used) == (
        "qwen35moe",
        40,
        2048,
        248_144,
        256,
        8,
    )
    specs = ss.target_tensors(t, "Q8_0")
    pc = ss.param_counts(t, specs)
    assert 34.0e9 < pc["params_total"] < 35.5e9
    assert 2.7e9 < pc["params_active"] < 3.3e9
    assert 36.0e9 < pc["bytes_total"] < 38.0e9  # Q8_0: 34 bytes per 32 weights
    assert sum(ss.is_recurrent(t, i) for i in range(40)) == 30  # full attention every 4th layer
    q4 = ss.param_counts(t, ss.target_tensors(t, "Q4_K"))
    assert 19.0e9 < q4["bytes_total"] < 20.5e9


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown shape"):
        shapes_for("llama-70b")
    with pytest.raises(UsageError, match="scale"):
        shapes_for(scale=0.0)
    with pytest.raises(UsageError, match="qtype"):
        ss.write_full_width(tmp_path, qtype="NVFP4", scale=0.05)


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory: pytest.TempPathFactory) -> ss.FullWidthPair:
    return ss.write_full_width(tmp_path_factory.mktemp("fw"), scale=0.05, seed=3)


def test_small_pair_files_match_plan_and_manifest(small_pair: ss.FullWidthPair) -> None:
    import gguf

    man = json.loads(small_pair.manifest.read_text())
    assert man["synthetic"] is True and man["target_arch"] == "qwen35moe" and "recurrent" in man["target_arch_reason"]
    t, d = shapes_for(scale=0.05)
    assert d.target_layers == (1, 2, 4, 6, 7) and t.n_layer == 8 and d.mask_token_id == t.vocab - 68
    for path, info, specs in (
        (small_pair.target, man["target"], ss.target_tensors(t, "Q8_0")),
        (small_pair.draft, man["draft"], ss.draft_tensors(d, "Q8_0")),
    ):
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"]  # hashed while streaming = hash of the file
        assert len(data) == info["bytes"]
        reader = gguf.GGUFReader(path)
        got = {tn.name: tn for tn in reader.tensors}
        assert list(got) == [s.name for s in specs]
        for s in specs:
            tn = got[s.name]
            assert tuple(int(x) for x in tn.shape) == s.ne
            assert tn.tensor_type.name == s.qtype
        if path == small_pair.draft:
            assert list(reader.fields["dflash.target_layers"].contents()) == [1, 2, 4, 6, 7]
            assert reader.fields["tokenizer.ggml.mask_token_id"].contents() == d.mask_token_id
            assert "token_embd.weight" not in got and "output.weight" not in got  # shared with the target
    # quantised weights decode to mean 0 and the planned std; norms are 1
    reader = gguf.GGUFReader(small_pair.target)
    tensors = {tn.name: tn for tn in reader.tensors}
    from gguf.quants import dequantize

    w = dequantize(tensors["blk.3.attn_q.weight"].data, tensors["blk.3.attn_q.weight"].tensor_type)
    assert abs(float(w.std()) - 0.5 / np.sqrt(t.n_embd)) < 0.002 and abs(float(w.mean())) < 1e-3
    assert np.all(tensors["blk.0.attn_norm.weight"].data == 1.0)
    assert np.all(tensors["blk.0.ssm_a"].data < 0)  # decays in (0, 1): the recurrent state cannot blow up


def test_q4k_blocks_decode_to_planned_std(tmp_path: Path) -> None:
    import gguf
    from gguf.quants import dequantize

    spec = TensorSpec("w", (512, 64), "Q4_K", "rand")
    kv = [("general.architecture", "str", "llama")]
    write_gguf(tmp_path / "q4k.gguf", kv, [spec])
    tn = gguf.GGUFReader(tmp_path / "q4k.gguf").tensors[0]
    w = dequantize(tn.data, tn.tensor_type)
    assert w.shape == (64, 512)
    assert abs(float(w.std()) - 0.5 / np.sqrt(512)) < 0.002 and abs(float(w.mean())) < 2e-3


def _run(
    engine, pair: ss.FullWidthPair, tmp_path: Path, *, synth_len: float, n_max: int, n_predict: int
) -> tuple[dict, dict]:
    cfg = ServerConfig(
        model=pair.target,
        draft=pair.draft,
        n_max=n_max,
        synth_len=synth_len,
        ctx=2048,
        threads=2,
        p_min=0.0,
        extra_args=CPU_ARGS,
    )
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        resp = srv.client.completion(
            {"prompt": list(range(1, 17)), "n_predict": n_predict, "temperature": 0, "ignore_eos": True, "seed": 7}
        )
        metrics = srv.client.metrics()
    return resp["timings"], metrics


def test_real_server_drafts_with_emulated_acceptance(engine, small_pair: ss.FullWidthPair, tmp_path: Path) -> None:
    # L = 1: every draft rejected, one token per step, so steps == tokens and nothing is accepted
    timings, m = _run(engine, small_pair, tmp_path, synth_len=1.0, n_max=3, n_predict=48)
    steps = m["llamacpp:spec_decode_num_drafts_total"]
    assert timings["predicted_n"] == 48
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == 0
    assert steps >= 46 and timings["draft_n"] >= 3 * (steps - 1)  # full drafts but the budget-cut last

    # L = 3 at budget 5: mean tokens per step ~ 3 over ~130 steps (sd of one step's length ~1.8)
    timings, m = _run(engine, small_pair, tmp_path, synth_len=3.0, n_max=5, n_predict=384)
    steps = m["llamacpp:spec_decode_num_drafts_total"]
    accepted = timings["draft_n_accepted"]
    assert m["llamacpp:spec_decode_num_accepted_tokens_total"] == accepted
    assert timings["draft_n"] >= 5 * (steps - 1) and timings["draft_n"] <= 5 * steps
    mean_len = 1 + accepted / steps
    assert abs(mean_len - 3.0) < 0.5, (mean_len, steps, accepted)
    assert 0.3 < accepted / timings["draft_n"] < 0.5  # (L-1)/n_max = 0.4 when drafts are full


# ------------------------------------------------------------------ the GPU study's tooling, on CPU


def _scripts():
    return script("gpu_sweep"), script("bench_to_md")


def test_sweep_grid_respects_llama_cpp_limit() -> None:
    gpu_sweep, _ = _scripts()
    cells = gpu_sweep.grid(gpu_sweep.BUDGETS, gpu_sweep.CATEGORIES, with_cost=False)
    # llama.cpp refuses L > n_max + 1; budgets 1 and 2 fit no upstream category (smallest L 3.501)
    assert all(c.budget >= c.synth_len - 1 for c in cells)
    assert len(cells) == 26 and len({(c.synth_len, c.budget) for c in cells}) == 26
    assert (cells[0].budget, cells[0].synth_len) == (7, 6.126)  # |k - (L + 1)| = 0.126: nearest first
    with_cost = gpu_sweep.grid(gpu_sweep.BUDGETS, gpu_sweep.CATEGORIES, with_cost=True, cost_n_predict=(64,))
    assert with_cost[:26] == cells  # the upstream grid keeps its place in front
    extra = [(c.category, c.synth_len, c.budget, c.n_predict, c.key) for c in with_cost[26:]]
    assert extra == [("cost", 1.0, k, (64,), f"L1-k{k}") for k in gpu_sweep.BUDGETS] + [
        ("full", 2.0, 1, (), "L2-k1"),
        ("full", 3.0, 2, (), "L3-k2"),
    ]
    assert len({c.key for c in with_cost}) == len(with_cost) == 35


def test_sweep_records_and_tables_trace_to_each_other(engine, small_pair: ss.FullWidthPair, tmp_path: Path) -> None:
    gpu_sweep, bench_to_md = _scripts()
    out, history = tmp_path / "sweep.jsonl", tmp_path / "history.jsonl"
    common = [
        "--manifest",
        str(small_pair.manifest),
        "--cpu",
        "--n-predict",
        "32",
        "--reps",
        "1",
        "--verify-reps",
        "1",
        "--budgets",
        "2",
        "3",
        "--categories",
        "general",
        "--with-cost",
        "--cost-n-predict",
        "16",
        "--load-mode",
        "auto",
        "--no-overhead",
        "--llama-bin",
        str(engine.bin_dir),
        "--log-dir",
        str(tmp_path / "logs"),
        "--mirror",
        str(history),
        "--resume",
        str(history),
    ]
    assert gpu_sweep.main(["--out", str(out)] + common) == 0
    recs = bench_to_md.load([out])
    by_type: dict[str, list[dict]] = {}
    for r in recs:
        by_type.setdefault(r["type"], []).append(r)
        assert r["synthetic"] is True
    assert history.read_text() == out.read_text()  # every record mirrored
    man = json.loads(small_pair.manifest.read_text())
    prov = by_type["provenance"][0]
    assert prov["files"]["target"]["sha256"] == man["target"]["sha256"] and prov["engine"]["commit"] == engine.commit
    assert {v["m"] for v in by_type["verify_cost"]} == {1, 3, 4}
    configs = {c["config"]: c for c in by_type["config"]}
    assert list(configs) == ["plain", "L3.501-k3", "L1-k2", "L1-k3", "L3-k2"]
    plain, spec, cost3 = configs["plain"], configs["L3.501-k3"], configs["L1-k3"]
    req = next(r for r in by_type["request"] if r["config"] == "L3.501-k3")
    assert req["draft_n"] > 0 and req["steps"] > 0 and req["metrics_drafted"] == req["draft_n"]
    assert req["mean_len"] == pytest.approx(1 + req["draft_n_accepted"] / req["steps"])
    assert req["t_draft_ms"] > 0 and req["draft_calls"] >= req["steps"]  # parsed from the -lv 4 statistics line
    s = spec["by_n_predict"]["32"]
    assert s["speedup_median"] == pytest.approx(s["tok_s"]["median"] / plain["by_n_predict"]["32"]["tok_s"]["median"])
    # L = 1: every draft rejected, one token per step, at its own n_predict
    c3 = cost3["by_n_predict"]["16"]
    assert list(cost3["by_n_predict"]) == ["16"] and c3["draft_n_accepted"] == 0 and c3["mean_len"]["median"] == 1.0
    # L = k + 1 = 3 at k = 2: every draft token accepted except where the request ends mid-block
    full = configs["L3-k2"]["by_n_predict"]["32"]
    assert full["draft_n_accepted"] >= full["draft_n"] - 2

    md = bench_to_md.render(recs)
    assert "SYNTHETIC" in md and man["target"]["sha256"][:16] in md
    assert f"**{s['speedup_median']:.2f}×**" in md
    t1 = plain["by_n_predict"]["32"]["t_step_ms"]["median"]
    # s (ms per accepted token): least squares over the two spec cells of step - step(L=1) against tau - 1
    pts = [
        (
            configs[key]["by_n_predict"]["32"]["mean_len"]["median"] - 1,
            configs[key]["by_n_predict"]["32"]["t_step_ms"]["median"]
            - configs[f"L1-k{k}"]["by_n_predict"]["16"]["t_step_ms"]["median"],
        )
        for key, k in (("L3.501-k3", 3), ("L3-k2", 2))
    ]
    s_tok = sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    tau, c_k = s["mean_len"]["median"], c3["t_step_ms"]["median"]
    bound, model = tau * t1 / c_k, tau * t1 / (c_k + (tau - 1) * s_tok)
    assert f"{bound:.2f} · {model:.2f} · **{s['speedup_median']:.2f}**" in md
    assert (
        f"| 3 | {c_k:.2f} | {c3['t_draft_ms']['median']:.2f} | {c_k - c3['t_draft_ms']['median']:.2f} | {t1:.3f} | {c_k / t1:.2f} |"
        in md
    )

    # a second call resumes from the mirrored history: only the plain baseline is measured again
    out2 = tmp_path / "sweep2.jsonl"
    assert gpu_sweep.main(["--out", str(out2)] + common) == 0
    again = [r for r in bench_to_md.load([out2]) if r["type"] == "config"]
    assert [c["config"] for c in again] == ["plain"]


def test_replicate_study_interleaves_loads_against_each_rounds_plain(
    engine, small_pair: ss.FullWidthPair, tmp_path: Path
) -> None:
    gpu_sweep, bench_to_md = _scripts()
    out = tmp_path / "rep.jsonl"
    common = [
        "--manifest",
        str(small_pair.manifest),
        "--cpu",
        "--n-predict",
        "32",
        "--reps",
        "1",
        "--load-mode",
        "auto",
        "--no-overhead",
        "--llama-bin",
        str(engine.bin_dir),
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    with pytest.raises(SystemExit) as bad:
        gpu_sweep.main(["--out", str(out), "--loads", "2", "--only", "L9-k3"] + common)
    assert bad.value.code == 2  # unknown configuration key: a usage error before any server starts
    assert gpu_sweep.main(["--out", str(out), "--loads", "2", "--only", "L3.501-k3"] + common) == 0
    configs = [r for r in bench_to_md.load([out]) if r["type"] == "config"]
    assert [(c["config"], c["load_round"]) for c in configs] == [
        ("plain", 0),
        ("L3.501-k3", 0),
        ("plain", 1),
        ("L3.501-k3", 1),
    ]
    for plain, spec in (configs[0:2], configs[2:4]):  # each ratio against the plain load of its own round
        s = spec["by_n_predict"]["32"]
        assert s["speedup_median"] == pytest.approx(
            s["tok_s"]["median"] / plain["by_n_predict"]["32"]["tok_s"]["median"]
        )
    md = bench_to_md.render(bench_to_md.load([out]))
    ups = sorted(c["by_n_predict"]["32"]["speedup_median"] for c in configs[1::2])
    assert "Load-to-load variation" in md
    assert "| L3.501-k3 | 32 | " in md and f"[{ups[0]:.2f}–{ups[1]:.2f}] (2 loads) | {ups[1] / ups[0] - 1:.1%} |" in md
