"""`dspark requant` with the real llama-quantize and llama-server on a synthetic DSpark draft with BF16 heads.

The synthetic draft (vocab 128, n_embd 128, confidence head) is rewritten with markov_w1, markov_w2 and fc in
BF16, then requantised to Q8_0. Its heads hold only 0 and 1 (identity, permutation, zeros): BF16 stores
them exactly and Q8_0 as 0 and 127 * fp16(1/127) = 0.99993896, so every argmax, and hence every draft,
stays what synth.predict says.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from dsparkcli import quantize_rules, requant
from dsparkcli.errors import UsageError, VerificationError
from dsparkcli.gguf import reader
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.cli import REPO, run_cli

HEADS = ("fc.weight", "markov_w1.weight", "markov_w2.weight")  # in file order
Q8_ONE = 127 * float(np.float16(1 / 127))  # what Q8_0 makes of 1.0: scale fp16(amax/127), quant 127
N_TENSORS = 18  # 16 of the synthetic draft + conf_proj.weight/.bias


def write_bf16_heads(src: Path, dst: Path) -> None:
    """Rewrite a (trusted) synthetic draft with its three heads stored as BF16, everything else unchanged."""
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "dflash")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        data = np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape)))
        if t.name in HEADS:
            w.add_tensor(
                t.name,
                gguf.quants.quantize(data.astype(np.float32), gguf.GGMLQuantizationType.BF16),
                raw_dtype=gguf.GGMLQuantizationType.BF16,
            )
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".dspark-" in p.name)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("requant")


@pytest.fixture(scope="module")
def pair(work) -> synth.SynthPair:
    return synth.write_pair(work / "pair", accept_rate=0.7, confidence=True, seed=5, block_size=8)


@pytest.fixture(scope="module")
def bf16_draft(pair, work) -> Path:
    path = work / "draft-bf16heads.gguf"
    write_bf16_heads(pair.draft, path)
    return path


@pytest.fixture(scope="module")
def quantize(engine) -> Path:
    return engine.tool("llama-quantize")


@pytest.fixture(scope="module")
def q8(quantize, bf16_draft, work) -> requant.RequantResult:
    return requant.requant(bf16_draft, work / "draft-q8heads.gguf", quantize)


def test_heads_become_q8_0_and_every_other_tensor_is_byte_identical(q8, bf16_draft, quantize, work, pair):
    plan = q8.plan
    # seed 001's recipe: full map, positional Q8_0, no --allow-requantize
    assert plan.command == (
        str(quantize),
        "--tensor-type-file",
        str(work / ".draft-q8heads.gguf.dspark-types.txt"),
        str(bf16_draft),
        str(work / ".draft-q8heads.gguf.dspark-partial"),
        "Q8_0",
    )
    assert len(plan.map_lines) == N_TENSORS and r"^markov_w1\.weight$=q8_0" in plan.map_lines
    assert r"^conf_proj\.weight$=f32" in plan.map_lines
    assert q8.census_before.counts() == {"F32": 15, "BF16": 3}
    assert q8.census_after.counts() == {"F32": 15, "Q8_0": 3}
    assert q8.census_after.rows == plan.census_after.rows  # census as predicted, bytes included
    q8_row = next(r for r in q8.census_after.rows if r.type_name == "Q8_0")
    assert (q8_row.n_elements, q8_row.n_bytes) == (32768 + 16384 + 16384, 34816 + 17408 + 17408)
    assert next(r.n_bytes for r in q8.census_before.rows if r.type_name == "BF16") == 131072

    v = q8.verification
    assert v.changed == HEADS
    assert len(v.identical) == N_TENSORS - 3
    assert v.respelled == (("conf_proj.weight", (256, 1), (256,)),)  # llama-quantize drops the trailing 1
    assert v.kv_set == {"general.file_type": 7, "general.quantization_version": 2}

    out = work / "draft-q8heads.gguf"
    h_in, h_out = reader.read_header(bf16_draft), reader.read_header(out)
    assert (q8.size_before, q8.size_after) == (bf16_draft.stat().st_size, out.stat().st_size)
    header_growth = h_out.data_offset - h_in.data_offset  # two KVs added (77 bytes), padded to 32
    assert header_growth in (64, 96)
    assert q8.size_before - q8.size_after == (131072 - 69632) - header_growth
    assert q8.ratio == pytest.approx(q8.size_after / q8.size_before)
    assert leftovers(work) == []

    # independent of gguf.reader: gguf-py reads both files, raw bytes and dequantised heads
    r_in, r_out = gguf.GGUFReader(str(bf16_draft)), gguf.GGUFReader(str(out))
    t_in = {t.name: t for t in r_in.tensors}
    t_out = {t.name: t for t in r_out.tensors}
    assert set(t_in) == set(t_out)
    for name, t in t_in.items():
        if name not in HEADS:
            assert t_out[name].tensor_type == t.tensor_type
            assert np.asarray(t_out[name].data).tobytes() == np.asarray(t.data).tobytes(), name
    man = synth.load_manifest(pair.manifest)
    deq = {n: gguf.quants.dequantize(np.asarray(t_out[n].data), gguf.GGMLQuantizationType.Q8_0) for n in HEADS}
    assert all(t_out[n].tensor_type == gguf.GGMLQuantizationType.Q8_0 for n in HEADS)
    assert np.array_equal(deq["markov_w1.weight"], np.eye(128, dtype=np.float32) * np.float32(Q8_ONE))
    w2 = np.zeros((128, 128), np.float32)
    w2[np.asarray(man.draft_map), np.arange(128)] = Q8_ONE
    assert np.array_equal(deq["markov_w2.weight"], w2)
    assert not deq["fc.weight"].any()


def test_requantised_draft_drafts_and_accepts_exactly_as_predicted(engine, pair, q8, work):
    man = synth.load_manifest(pair.manifest)
    cfg = ServerConfig(model=pair.target, draft=q8.plan.dst, n_max=7, ctx=1024, threads=2)
    drafted = accepted = 0
    with LlamaServer(engine, cfg, log_dir=work, startup_timeout=60) as srv:
        for prompt, n_predict in (([1, 2, 3], 40), ([77], 29), ([5, 100, 42], 17)):
            resp = srv.client.completion(
                {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True}
            )
            pred = synth.predict(man, prompt, n_max=7, n_predict=n_predict)
            t = resp["timings"]
            assert resp["tokens"] == list(pred.tokens), prompt
            assert (t.get("draft_n", 0), t.get("draft_n_accepted", 0)) == (pred.draft_n, pred.draft_n_accepted), prompt
            drafted += pred.draft_n
            accepted += pred.draft_n_accepted
    assert 0 < accepted < drafted  # wrong rows exist: a broken Markov head would change these counts


def test_map_through_positional_copy_is_caught(quantize, bf16_draft, work):
    with pytest.raises(UsageError, match="positional type COPY makes llama-quantize ignore --tensor-type-file"):
        requant.build_plan(bf16_draft, work / "copy.gguf", positional="COPY", quantize=quantize)
    plan = requant.build_plan(bf16_draft, work / "copy.gguf", quantize=quantize)
    copy = dataclasses.replace(
        plan,
        positional="COPY",
        command=requant.quantize_command(quantize, plan.src, plan.partial_path, plan.map_path, "COPY", False),
    )
    with pytest.raises(VerificationError) as e:  # llama-quantize exits 0 and copies the heads unchanged
        requant.execute(copy)
    assert str(e.value) == (
        f"{plan.partial_path}: fc.weight is BF16, planned Q8_0; markov_w1.weight is BF16, "
        "planned Q8_0; markov_w2.weight is BF16, planned Q8_0"
    )
    assert not (work / "copy.gguf").exists() and leftovers(work) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"heads": "q6_K"},
            (
                "markov_w1.weight: rows of 128 values are not a multiple of the Q6_K block (256); "
                "llama-quantize would silently write Q8_0 instead"
            ),
        ),
        (
            {"overrides": ["blk.0.ffn_down.weight=q6_k"]},
            (
                "blk.0.ffn_down.weight: rows of 64 values are not a multiple of the Q6_K block (256); llama-quantize would "
                "silently write Q8_0 instead"
            ),
        ),
        (
            {"overrides": ["conf_proj.weight=q8_0"]},
            "conf_proj.weight [256, 1] stays F32: llama-quantize keeps 1-D tensors in their stored type, so it cannot become Q8_0",
        ),
        (
            {"overrides": ["blk.0.attn_norm.weight=bf16"]},
            "blk.0.attn_norm.weight [128] stays F32: llama-quantize keeps 1-D",
        ),
        ({"overrides": ["nope.weight=q8_0"]}, "--tensor nope.weight: no tensor of that name in draft-bf16heads.gguf"),
        ({"overrides": ["fc.weight"]}, "--tensor takes NAME=TYPE"),
        ({"overrides": ["fc.weight=iq2_xxs"]}, "unsupported tensor type 'iq2_xxs'"),
        ({"heads": "f16"}, "--heads must be one of q8_0, q6_K, bf16"),
    ],
)
def test_llama_quantize_quirks_are_refused_up_front(quantize, bf16_draft, work, kw, message):
    with pytest.raises(UsageError) as e:
        requant.build_plan(bf16_draft, work / "never.gguf", quantize=quantize, **kw)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (work / "never.gguf").exists()


def test_the_refused_quirks_are_what_llama_quantize_really_does(quantize, bf16_draft, work):
    """Bypass the up-front checks: the real binary falls back to Q8_0 for Q6_K rows of 128 and keeps 1-D F32."""
    plan = requant.build_plan(bf16_draft, work / "quirk.gguf", quantize=quantize)
    bad = {"markov_w1.weight": ("Q6_K", 16384 // 256 * 210), "conf_proj.weight": ("Q8_0", 256 // 32 * 34)}
    tensors = tuple(
        dataclasses.replace(t, target=bad[t.name][0], bytes_after=bad[t.name][1]) if t.name in bad else t
        for t in plan.tensors
    )
    with pytest.raises(VerificationError) as e:
        requant.execute(dataclasses.replace(plan, tensors=tensors))
    msg = str(e.value)
    assert "conf_proj.weight is F32, planned Q8_0" in msg and "markov_w1.weight is Q8_0, planned Q6_K" in msg
    assert not (work / "quirk.gguf").exists() and leftovers(work) == []


def test_requantising_needs_the_flag_and_a_failed_run_leaves_nothing(quantize, q8, work):
    src = q8.plan.dst  # heads already Q8_0
    with pytest.raises(UsageError, match=r"fc.weight is already Q8_0: making it Q4_0 requantises"):
        requant.build_plan(src, work / "q4.gguf", overrides=["fc.weight=q4_0"], quantize=quantize)
    plan = requant.build_plan(
        src, work / "q4.gguf", overrides=["fc.weight=q4_0"], allow_requantize=True, quantize=quantize
    )
    assert plan.command[3] == "--allow-requantize"
    # without the flag llama-quantize refuses half-way and leaves its partial output: dspark removes it
    no_flag = dataclasses.replace(
        plan,
        command=requant.quantize_command(quantize, plan.src, plan.partial_path, plan.map_path, plan.positional, False),
    )
    with pytest.raises(requant.QuantizeError, match=r"failed \(exit 1\): requantizing from type q8_0 is disabled$"):
        requant.execute(no_flag)
    assert not (work / "q4.gguf").exists() and leftovers(work) == []
    result = requant.execute(plan)
    assert result.census_after.counts() == {"F32": 15, "Q8_0": 2, "Q4_0": 1}
    assert result.verification.changed == ("fc.weight",)  # markov_w1/w2 stay byte-identical Q8_0
    assert next(r.n_bytes for r in result.census_after.rows if r.type_name == "Q4_0") == 32768 // 32 * 18


def test_q6_K_where_the_rows_allow_it(quantize, bf16_draft, work):
    result = requant.requant(bf16_draft, work / "q6fc.gguf", quantize, overrides=["fc.weight=q6_K"])
    assert result.plan.positional == "Q8_0"
    assert result.census_after.counts() == {"F32": 15, "Q8_0": 2, "Q6_K": 1}
    assert next(r.n_bytes for r in result.census_after.rows if r.type_name == "Q6_K") == 32768 // 256 * 210
    assert result.verification.changed == HEADS and len(result.verification.identical) == N_TENSORS - 3


def test_fallback_rules_match_llama_quant_cpp():
    assert quantize_rules.fallback_type("Q6_K", 128) == "Q8_0"
    assert quantize_rules.fallback_type("Q6_K", 48) == "F16"
    assert quantize_rules.fallback_type("Q8_0", 48) == "F16"
    assert quantize_rules.fallback_type("Q4_K", 96) == "Q5_0"
    assert quantize_rules.fallback_type("Q8_0", 64) is None and quantize_rules.fallback_type("BF16", 7) is None
    assert quantize_rules.n_dims((2304, 1)) == 1 and quantize_rules.n_dims((128, 1, 3)) == 3
    assert quantize_rules.map_pattern("blk.1.attn_q.weight") == r"^blk\.1\.attn_q\.weight$"


def test_cli_dry_run_plan_errors_and_real_run(quantize, bf16_draft, work):
    out = work / "cli-q8.gguf"
    r = run_cli("requant", str(bf16_draft), str(out), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True
    assert doc["plan"]["command"] == [
        str(quantize),
        "--tensor-type-file",
        str(work / ".cli-q8.gguf.dspark-types.txt"),
        str(bf16_draft),
        str(work / ".cli-q8.gguf.dspark-partial"),
        "Q8_0",
    ]
    assert doc["plan"]["changes"] == list(HEADS) and len(doc["plan"]["map"]) == N_TENSORS
    assert doc["plan"]["predicted_tensor_bytes"] == (90752 + 257) * 4 + 69632  # F32 kept, heads as Q8_0
    assert not out.exists() and leftovers(work) == []

    for args, needle in (
        ((str(bf16_draft), str(bf16_draft)), f"is the input {bf16_draft}"),
        ((str(bf16_draft), str(out), "--heads", "q6_K"), "not a multiple of the Q6_K block (256)"),
    ):
        r = run_cli("requant", *args)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.startswith("dspark: error: ") and needle in r.stderr and r.stderr.count("\n") == 1

    r = run_cli("requant", str(bf16_draft), str(out))
    assert r.returncode == 0, r.stderr
    assert "verified: 3 changed as planned, 15 byte-identical, 1 with a respelled shape" in r.stdout
    ratio = out.stat().st_size / bf16_draft.stat().st_size
    assert (
        f"({ratio:.3f}x)" in r.stdout
        and "census after:  15 F32 (364,036 B) + 3 Q8_0 (69,632 B) (read back)" in r.stdout
    )
    r = run_cli("requant", str(bf16_draft), str(out))
    assert r.returncode == 2 and f"output exists: {out} (pass --force to replace it)" in r.stderr

    r = run_cli("requant", "--help")
    assert r.returncode == 0 and "Examples:\n    dspark requant draft-bf16.gguf draft-q8heads.gguf" in r.stdout


def test_standalone_type_map_script(q8, bf16_draft, work):
    r = subprocess.run(
        [sys.executable, "-m", "study.gguf_tensor_type_map", str(bf16_draft)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    assert tuple(r.stdout.splitlines()) == q8.plan.map_lines
    assert sum(line.endswith("=q8_0") for line in r.stdout.splitlines()) == 3
