"""dspark inspect: DSpark structure, pairing verdicts (each mismatch kind), diff, memory, models.toml, hf://.

Pairing verdicts are cross-checked against the real llama-server on synthetic pairs: a pair inspect
accepts loads, the mmproj it rejects is refused by llama.cpp too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from dsparkcli import inspect as ins
from dsparkcli.errors import ServerError, UsageError
from dsparkcli.gguf import analysis, hashes, memory, pairing
from dsparkcli.gguf import reader as gc
from dsparkcli.hub.range import read_gguf
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.gguf_fixtures import (
    HEAD_DIM,
    N_HEAD_KV,
    RANK,
    TAPS,
    DraftSpec,
    E,
    write_draft,
    write_mmproj,
    write_target,
)
from support.hubserver import FakeHub


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inspect")
    return {
        "target": write_target(d / "MiniCPM-V-4.7-35B-A3B-NVFP4-MEDIUM.gguf"),
        "draft": write_draft(d / "dspark-MiniCPM-V-4.7-35B-A3B-NVFP4A16-q8heads.gguf"),
        "bf16heads": write_draft(d / "dspark-bf16heads.gguf", DraftSpec(heads=Q.BF16, conf_shape=(E + RANK, 1))),
        "mmproj": write_mmproj(d / "mmproj.gguf"),
    }


# ------------------------------------------------------------------ structure


def test_dspark_structure_of_the_draft(files: dict[str, Path]) -> None:
    s = analysis.dspark_structure(gc.read_header(files["draft"]))
    assert s is not None and s.kind == "dspark"
    assert (s.block_size, s.target_layers, s.mask_token_id, s.markov_rank) == (15, TAPS, 998, RANK)
    assert s.confidence_head and s.has_confidence_head_key is True and s.confidence_head_consistent
    assert s.required_missing == () and s.problems == ()
    assert s.sample_from_anchor and s.max_spec_draft_n == 15  # anchor-first: the whole block
    assert s.head_types == {
        "fc.weight": "Q8_0",
        "markov_w1.weight": "Q8_0",
        "markov_w2.weight": "Q8_0",
        "conf_proj.weight": "BF16",
    }
    assert s.kv_bytes_per_token == 5 * 2 * N_HEAD_KV * HEAD_DIM * 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (DraftSpec(sample_from_anchor=False), {"max_spec_draft_n": 14, "problems": ()}),
        (DraftSpec(has_confidence_head=False), {"confidence_head_consistent": False}),
        (DraftSpec(with_conf_proj=False, has_confidence_head=None), {"confidence_head_consistent": False}),
        (
            DraftSpec(with_conf_proj=False, has_confidence_head=False),
            {"confidence_head_consistent": True, "problems": ()},
        ),
        (
            DraftSpec(drop=("blk.3.attn_k_norm.weight", "fc.weight")),
            {"required_missing": ("fc.weight", "blk.3.attn_k_norm.weight")},
        ),
        (DraftSpec(block_size=None), {"block_size": None, "max_spec_draft_n": None}),
    ],
)
def test_structure_variants(tmp_path: Path, spec: DraftSpec, expected: dict) -> None:
    s = analysis.dspark_structure(gc.read_header(write_draft(tmp_path / "d.gguf", spec)))
    for key, value in expected.items():
        assert getattr(s, key) == value, key
    if "problems" not in expected:
        assert len(s.problems) == 1  # each variant breaks exactly one thing


def test_kv_bytes_per_token_of_the_real_draft_dimensions(tmp_path: Path) -> None:
    """MiniCPM-V-4.7 DSpark: 5 layers, 8 heads / 2 KV heads, head dim 256 -> 10 240 bytes per token (f16)."""
    w = GGUFWriter(tmp_path / "real-dims.gguf", "dflash")
    for key, value in (
        ("block_count", 5),
        ("embedding_length", 2048),
        ("attention.head_count", 8),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 256),
        ("block_size", 15),
    ):
        w.add_uint32(f"dflash.{key}", value)
    w.write_header_to_file(tmp_path / "real-dims.gguf")
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    h = gc.read_header(tmp_path / "real-dims.gguf")
    assert analysis.dspark_structure(h).kv_bytes_per_token == 10_240
    m = memory.memory_estimate(h, 8192)
    assert m.kv.bytes_per_token == 10_240 and m.kv_bytes == 10_240 * 8192
    assert m.kv.formula == "5 layers x 2 x 2 kv heads x 256 head dim x 2 B = 10240 B"


# ------------------------------------------------------------------ pairing


def test_matching_pair_with_mmproj_is_compatible(files: dict[str, Path]) -> None:
    v = pairing.check_pair(files["target"], files["draft"], files["mmproj"])
    assert v.ok and v.reasons == ()
    assert {c.name for c in v.checks} == {
        "target role",
        "target exposes layer inputs",
        "draft arch",
        "vocab",
        "BOS",
        "EOS",
        "hidden size",
        "taps",
        "draft structure",
        "mmproj width",
    }
    assert all(c.ok for c in v.checks)


MISMATCHES = {
    "vocab count": ({"vocab": 999}, {}, "vocab", "target has 1000 tokens, draft 999"),
    "vocab strings": ({"token_swap": (5, 7)}, {}, "vocab", "first difference at id 5: tok5 vs tok7"),
    "BOS": ({"bos": 0}, {}, "BOS", "target 1, draft 0"),
    "EOS": ({"eos": None}, {}, "EOS", "target 2, draft unset"),
    "hidden size": ({"embd": 128}, {}, "hidden size", "target 256, draft 128"),
    "taps": ({"taps": (4, 12, 20, 28, 40)}, {}, "taps", "[40] out of range (must be < 40)"),
    "taps few layers": ({}, {"n_layer": 36}, "taps", "[36] out of range (must be < 36)"),
    "target arch": ({}, {"arch": "qwen2"}, "target exposes layer inputs", "qwen2 does not fill t_layer_inp"),
}


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_each_mismatch_kind_fails_exactly_its_check(tmp_path: Path, kind: str) -> None:
    draft_kw, target_kw, check, detail = MISMATCHES[kind]
    draft = write_draft(tmp_path / "d.gguf", DraftSpec(**draft_kw))
    target = write_target(tmp_path / "t.gguf", **target_kw)
    v = pairing.check_pair(target, draft)
    assert not v.ok
    failed = [c for c in v.checks if c.ok is False]
    assert [c.name for c in failed] == [check], v.reasons
    assert detail in failed[0].detail
    assert v.reasons == (f"{check}: {failed[0].detail}",)


def test_last_layer_tap_allowed_only_for_archs_that_expose_it(tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "d.gguf", DraftSpec(taps=(4, 40)))
    assert pairing.check_pair(write_target(tmp_path / "n.gguf", arch="nemotron_h"), draft).ok
    assert not pairing.check_pair(write_target(tmp_path / "q.gguf", arch="qwen3"), draft).ok


def test_mmproj_width_mismatch(tmp_path: Path, files: dict[str, Path]) -> None:
    v = pairing.check_pair(files["target"], files["draft"], write_mmproj(tmp_path / "m.gguf", out_width=512))
    assert [c.name for c in v.checks if c.ok is False] == ["mmproj width"]
    assert "the projector feeds 512-wide embeddings (mm.2.weight ne[1] (mlp)), the target's are 256" in v.reasons[0]


def test_mmproj_of_unknown_projector_is_unchecked_not_failed(tmp_path: Path, files: dict[str, Path]) -> None:
    v = pairing.check_pair(files["target"], None, write_mmproj(tmp_path / "m.gguf", projector="fancy\x1b[2J"))
    (width,) = [c for c in v.checks if c.name == "mmproj width"]
    assert width.ok is None and "\\x1b[2J" in width.detail and "\x1b" not in width.detail
    assert v.ok


def test_draft_given_as_target_is_refused(files: dict[str, Path]) -> None:
    v = pairing.check_pair(files["draft"], files["draft"])
    assert not v.ok and "target role: arch dflash is not a text model" in v.reasons


def test_synthetic_pair_verdict_agrees_with_the_real_llama_server(tmp_path: Path, engine) -> None:
    """The pair inspect accepts loads in llama-server; the mmproj inspect rejects is refused by llama.cpp."""
    good = synth.write_pair(tmp_path / "a", vocab=128, vision=True, seed=1)
    other = synth.write_pair(tmp_path / "b", vocab=200, vision=True, seed=2)  # n_embd 256 instead of 128
    v = pairing.check_pair(good.target, good.draft, good.mmproj)
    assert v.ok, v.reasons
    s = analysis.dspark_structure(gc.read_header(good.draft))
    assert s.kind == "dspark" and s.block_size == 8 and s.mask_token_id == 127 and s.max_spec_draft_n == 8
    cfg = ServerConfig(model=good.target, draft=good.draft, mmproj=good.mmproj, n_max=7, ctx=512, threads=1)
    with LlamaServer(engine, cfg) as srv:
        out = srv.client.completion({"prompt": [1, 2, 3], "n_predict": 8, "temperature": 0})
        assert out["timings"]["draft_n"] > 0

    bad = pairing.check_pair(good.target, good.draft, other.mmproj)
    assert [c.name for c in bad.checks if c.ok is False] == ["mmproj width"]
    assert "the projector feeds 256-wide embeddings (mm.2.weight ne[1] (mlp)), the target's are 128" in bad.reasons[0]
    with (
        pytest.raises(ServerError) as info,
        LlamaServer(engine, ServerConfig(model=good.target, mmproj=other.mmproj, ctx=512, threads=1)),
    ):
        pass
    assert "mismatch between text model" in info.value.log_tail


def test_census_of_the_synthetic_pair_matches_gguf_py(tmp_path: Path) -> None:
    import gguf

    pair = synth.write_pair(tmp_path / "s", vocab=128, vision=True, confidence=True, seed=4)
    for path in (pair.target, pair.draft, pair.mmproj):
        ref = gguf.GGUFReader(path)
        expected_counts: dict[str, int] = {}
        expected_bytes: dict[str, int] = {}
        for t in ref.tensors:
            expected_counts[t.tensor_type.name] = expected_counts.get(t.tensor_type.name, 0) + 1
            expected_bytes[t.tensor_type.name] = expected_bytes.get(t.tensor_type.name, 0) + int(t.n_bytes)
        c = analysis.census(gc.read_header(path))
        assert c.counts() == expected_counts
        assert {r.type_name: r.n_bytes for r in c.rows} == expected_bytes
        assert c.n_params == sum(int(t.n_elements) for t in ref.tensors)
    s = analysis.dspark_structure(gc.read_header(pair.draft))
    assert s.confidence_head and s.confidence_head_consistent and s.markov_rank == 128


# ------------------------------------------------------------------ diff


def test_heads_requantised_pair_is_94_of_97_identical(files: dict[str, Path]) -> None:
    a, b = gc.read_header(files["bf16heads"]), gc.read_header(files["draft"])
    d = hashes.diff_tensors(a, hashes.hash_file(files["bf16heads"], a), b, hashes.hash_file(files["draft"], b))
    assert len(d.identical) == 94 and (d.n_a, d.n_b) == (97, 97)
    assert d.summary == "94/97 identical, 3 changed, 0 only in A, 0 only in B"
    assert {c.name: (c.a_type, c.b_type) for c in d.changed} == {
        "fc.weight": ("BF16", "Q8_0"),
        "markov_w1.weight": ("BF16", "Q8_0"),
        "markov_w2.weight": ("BF16", "Q8_0"),
    }
    fc = next(c for c in d.changed if c.name == "fc.weight")
    assert (fc.a_bytes, fc.b_bytes) == (len(TAPS) * E * E * 2, len(TAPS) * E * E // 32 * 34)
    assert d.respelled == (("conf_proj.weight", (E + RANK, 1), (E + RANK,)),)
    assert d.only_a == () and d.only_b == ()


def test_diff_reports_tensors_only_in_one_file(tmp_path: Path, files: dict[str, Path]) -> None:
    c = write_draft(tmp_path / "noconf.gguf", DraftSpec(with_conf_proj=False, has_confidence_head=False))
    a, b = gc.read_header(files["draft"]), gc.read_header(c)
    d = hashes.diff_tensors(a, hashes.hash_file(files["draft"], a), b, hashes.hash_file(c, b))
    assert set(d.only_a) == {"conf_proj.weight", "conf_proj.bias"} and d.only_b == ()
    assert len(d.identical) == 95 and d.changed == ()


# ------------------------------------------------------------------ memory


def test_memory_estimate_of_a_hybrid_target(files: dict[str, Path]) -> None:
    h = gc.read_header(files["target"])
    m = memory.memory_estimate(h, 4096)
    # 40 blocks, full attention every 4th -> 10 KV layers x 2 x 2 heads x 64 x 2 bytes
    assert m.kv.n_kv_layers == 10 and m.kv.bytes_per_token == 10 * 2 * 2 * 64 * 2
    assert m.kv_bytes == 5120 * 4096
    assert m.weights_bytes == analysis.census(h).tensor_bytes and m.total_bytes == m.weights_bytes + m.kv_bytes
    assert any("every 4th layer" in n for n in m.kv.notes)
    both = ins.inspect_files([str(files["target"]), str(files["draft"])], ctx=4096, auto_expect=False)
    draft_m = both.files[1].memory
    assert draft_m.kv_bytes == 5 * 2 * N_HEAD_KV * HEAD_DIM * 2 * 4096  # the draft's context is the target's
    assert both.memory_total == m.total_bytes + draft_m.weights_bytes + draft_m.kv_bytes
    q8 = memory.memory_estimate(h, 4096, kv_type="q8_0")
    assert q8.kv.bytes_per_token == int(10 * 2 * 2 * 64 * 34 / 32)
    with pytest.raises(UsageError):
        memory.memory_estimate(h, 0)


# ------------------------------------------------------------------ models.toml expectations


@pytest.fixture
def user_registry(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, user_models) -> Path:
    draft = files["draft"]
    sha = hashes.hash_file(draft).file_sha256
    conf = user_models(f"""
[pairs.testpair]
description = "fixture pair"
[pairs.testpair.target]
repo = "org/target"
filename = "{files["target"].name}"
[pairs.testpair.drafts.q8heads]
repo = "org/draft"
filename = "{draft.name}"
size = {draft.stat().st_size}
sha256 = "{sha}"
census = {{ NVFP4 = 35, Q8_0 = 3, F32 = 58, BF16 = 1 }}
[pairs.testpair.drafts.wrong]
repo = "org/draft"
filename = "other.gguf"
size = 123
census = {{ Q8_0 = 97 }}
""")
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(conf))
    return conf


def test_expect_matches_pinned_size_census_and_sha256(user_registry: Path, files: dict[str, Path]) -> None:
    r = ins.inspect_files([str(files["draft"])], expect="testpair")
    e = r.files[0].expect
    assert e.ok and e.key == "q8heads"
    assert {c.name: c.ok for c in e.checks} == {"size": True, "census": True, "sha256": True}
    assert r.files[0].file_sha256 is not None  # a pinned sha256 makes inspect hash the file


def test_expect_reports_each_mismatch(user_registry: Path, files: dict[str, Path]) -> None:
    e = ins.inspect_files([str(files["draft"])], expect="testpair:wrong").files[0].expect
    assert not e.ok
    assert {c.name: c.ok for c in e.checks} == {"size": False, "census": False, "sha256": None}
    census = next(c for c in e.checks if c.name == "census")
    assert census.expected == {"Q8_0": 97} and census.actual == {"NVFP4": 35, "Q8_0": 3, "F32": 58, "BF16": 1}


def test_hashed_file_is_matched_by_pinned_sha256_under_any_name(
    user_registry: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(files["draft"].read_bytes())
    assert ins.inspect_files([str(renamed)]).files[0].expect is None  # not hashed: nothing to match
    e = ins.inspect_files([str(renamed)], do_hash=True).files[0].expect
    assert e is not None and not e.explicit and (e.model, e.key) == ("testpair", "q8heads")
    assert {c.name: c.ok for c in e.checks} == {"size": True, "census": True, "sha256": True}


def test_expect_unknown_file_is_a_usage_error(user_registry: Path, files: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match="matches none of testpair's files"):
        ins.inspect_files([str(files["mmproj"])], expect="testpair")


def test_file_named_like_a_pinned_registry_file_is_checked_automatically(files: dict[str, Path], cli) -> None:
    e = ins.inspect_files([str(files["draft"])]).files[0].expect  # same name as the packaged NVFP4A16 draft
    assert e is not None and not e.explicit
    assert (e.model, e.key) == ("minicpm-v-4.7", "nvfp4a16-q8heads")
    checks = {c.name: c for c in e.checks}
    assert checks["census"].ok is True  # same 97-tensor layout as the real file
    assert checks["size"].ok is False and checks["size"].expected == 303_989_824
    assert checks["sha256"].ok is None  # never hashed automatically
    r = cli("inspect", str(files["draft"]))
    assert r.returncode == 0 and "registry file of the same name: minicpm-v-4.7 draft" in r.stdout
    assert ins.inspect_files([str(files["target"])]).files[0].expect is None  # pins nothing: no check


def test_packaged_registry_pins_the_real_draft_census() -> None:
    from dsparkcli.hub import registry

    mf = ins.find_expected("minicpm-v-4.7", "dspark-MiniCPM-V-4.7-35B-A3B-NVFP4A16-q8heads.gguf")
    assert mf.key == "nvfp4a16-q8heads" and mf.size == 303_989_824
    assert registry.load_registry().get("minicpm-v-4.7").drafts["nvfp4a16-q8heads"].census == mf.census


# ------------------------------------------------------------------ text safety


def test_printable_escapes_terminal_controls() -> None:
    assert analysis.printable("a\x1b[31mb\nc\u202ed\x00") == "a\\x1b[31mb\\x0ac\\u202ed\\x00"
    assert analysis.printable("x" * 300, 10) == "xxxxxxxxxx… (+290 chars)"


# ------------------------------------------------------------------ CLI


def test_cli_pair_compatible_exit_0_and_json(cli, files: dict[str, Path]) -> None:
    r = cli("inspect", str(files["target"]), str(files["draft"]), str(files["mmproj"]), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pairing"]["ok"] is True
    draft = doc["files"][1]
    assert {row["type_name"]: row["count"] for row in draft["census"]["rows"]} == {
        "NVFP4": 35,
        "Q8_0": 3,
        "F32": 58,
        "BF16": 1,
    }
    assert draft["structure"]["max_spec_draft_n"] == 15 and len(draft["tensors"]) == 97
    assert draft["metadata"]["tokenizer.ggml.tokens"]["count"] == 1000


def test_cli_pair_incompatible_exit_1_one_line(cli, tmp_path: Path, files: dict[str, Path]) -> None:
    bad = write_draft(tmp_path / "bad.gguf", DraftSpec(embd=128))
    r = cli("inspect", str(files["target"]), str(bad))
    assert r.returncode == 1
    assert "hidden size" in r.stdout and "NOT compatible" in r.stdout
    assert r.stderr == (
        f"dspark: error: not a compatible pair: draft {bad} does not fit target {files['target']}: "
        "hidden size: target 256, draft 128\n"
    )


def test_cli_table_census_line_and_against(cli, files: dict[str, Path]) -> None:
    r = cli("inspect", str(files["bf16heads"]), "--against", str(files["draft"]), "-c", "8192")
    assert r.returncode == 0, r.stderr
    assert "97 tensors = 35 NVFP4 + 4 BF16 + 58 F32\n" in r.stdout  # by bytes, largest first
    assert "94/97 identical, 3 changed, 0 only in A, 0 only in B" in r.stdout
    assert "same data, shape spelled (320, 1) vs (320): conf_proj.weight" in r.stdout
    assert "5 layers x 2 x 2 kv heads x 64 head dim x 2 B = 2560 B" in r.stdout


def test_cli_escapes_hostile_metadata(cli, tmp_path: Path) -> None:
    evil = write_draft(tmp_path / "evil.gguf", DraftSpec(name="pwn\x1b]0;owned\x07\x1b[2J", chat_template="x"))
    r = cli("inspect", str(evil))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "pwn\\x1b]0;owned\\x07\\x1b[2J" in r.stdout


def test_cli_malformed_and_missing_files_exit_2(cli, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + (1 << 62).to_bytes(8, "little") + bytes(8))
    r = cli("inspect", str(junk))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("dspark: error: ") and "implausible tensor count" in r.stderr
    assert r.stderr.count("\n") == 1
    r = cli("inspect", str(tmp_path / "nope.gguf"))
    assert r.returncode == 2 and r.stderr.startswith("dspark: error: file not found")


def _u64_file(path: Path) -> bytes:
    """A GGUF written by gguf-py holding uint64 values at and above 2**63 and an int32 array."""
    import numpy as np

    w = GGUFWriter(str(path), "llama")
    w.add_uint64("test.big", 2**63)
    w.add_uint64("test.max", 2**64 - 1)
    w.add_array("test.arr", [1, 2, 3])
    w.add_tensor("t", np.zeros((4,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_uint64_values_and_counts_print_unsigned(cli, tmp_path: Path) -> None:
    """GGUF counts, dimensions and uint64 values are unsigned: 2**63 prints as 9223372036854775808, in the
    metadata and in the one-line error about a hostile count (it was -9223372036854775808)."""
    raw = _u64_file(tmp_path / "u.gguf")
    r = cli("inspect", str(tmp_path / "u.gguf"), "--json")
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout)["files"][0]["metadata"]
    assert meta["test.big"] == 2**63 and meta["test.max"] == 2**64 - 1 and meta["test.arr"]["count"] == 3
    dim_at = raw.index((1).to_bytes(8, "little") + b"t" + (1).to_bytes(4, "little")) + 13  # name "t", 1 dim: ne[0]
    arr_count_at = raw.index(b"test.arr") + len(b"test.arr") + 8
    cases = {  # byte offset of a uint64 set to 2**63 -> what the one line says
        8: "implausible tensor count 9223372036854775808 for a",
        16: "implausible metadata count 9223372036854775808 for a",
        arr_count_at: "value of 'test.arr': array of 9223372036854775808 int32 runs past the end",
        dim_at: "tensor 't' dimension 9223372036854775808 is beyond ggml's int64 range",
    }
    for at, phrase in cases.items():
        bad = tmp_path / f"at-{at}.gguf"
        bad.write_bytes(raw[:at] + (2**63).to_bytes(8, "little") + raw[at + 8 :])
        r = cli("inspect", str(bad))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert phrase in r.stderr and "-9223372036854775808" not in r.stderr, r.stderr


def test_cli_expect_mismatch_exits_6(cli, user_registry: Path, files: dict[str, Path]) -> None:
    env = {"DSPARK_CONFIG_DIR": str(user_registry)}
    r = cli("inspect", str(files["draft"]), "--expect", "testpair", env=env)
    assert r.returncode == 0, r.stderr
    assert "matches" in r.stdout
    r = cli("inspect", str(files["draft"]), "--expect", "testpair:wrong", env=env)
    assert r.returncode == 6 and "Traceback" not in r.stderr
    assert r.stderr.startswith("dspark: error: ") and "(size, census)" in r.stderr


def test_cli_help_has_examples(cli) -> None:
    r = cli("inspect", "--help")
    assert r.returncode == 0 and "Examples:" in r.stdout and "--against" in r.stdout and "hf://" in r.stdout


# ------------------------------------------------------------------ hf:// through HTTP range requests


def test_hf_header_only_read_counts_bytes_served(tmp_path: Path) -> None:
    big_target = write_target(tmp_path / "t.gguf", vocab=60_000)  # ~1 MB header: the window has to grow
    data = big_target.read_bytes()
    padded = data + bytes(32 << 20)  # 32 MB of trailing bytes that must never be fetched
    with FakeHub() as hub:
        hub.add_file("org/repo", "sub/t.gguf", padded)
        h = read_gguf("hf://org/repo/sub/t.gguf", endpoint=hub.endpoint)
        local = gc.read_header(big_target)
        assert [t.name for t in h.tensors] == [t.name for t in local.tensors]
        assert h.kv["tokenizer.ggml.tokens"].sha256 == local.kv["tokenizer.ggml.tokens"].sha256
        assert h.file_size == len(padded) and h.remote_sha256 == hashlib.sha256(padded).hexdigest()
        ranged = [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]
        assert ranged and all(r.range and r.range.startswith("bytes=") for r in ranged)
        assert hub.bytes_served < 2 * local.header_bytes + (64 << 10)  # header only, never the 32 MB
        assert local.header_bytes > 512 << 10
        print(
            f"hf:// header {local.header_bytes} B, served {hub.bytes_served} B in {len(ranged)} range GETs "
            f"of a {len(padded)} B file"
        )


def test_hf_pairing_and_cli(files: dict[str, Path], cli, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeHub() as hub:
        hub.add_file("org/target", "t.gguf", files["target"].read_bytes())
        hub.add_file("org/draft", "d.gguf", files["draft"].read_bytes(), revision="v1")
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        v = pairing.check_pair(read_gguf("hf://org/target/t.gguf"), read_gguf("hf://org/draft@v1/d.gguf"))
        assert v.ok, v.reasons
        r = cli(
            "inspect",
            "hf://org/target/t.gguf",
            "hf://org/draft@v1/d.gguf",
            "--json",
            env={"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"},
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["pairing"]["ok"] and doc["files"][1]["census"]["n_tensors"] == 97
        r = cli("inspect", "hf://org/draft/missing.gguf", env={"HF_ENDPOINT": hub.endpoint})
        assert r.returncode == 5 and r.stderr.startswith("dspark: error: ") and "Traceback" not in r.stderr
        r = cli("inspect", "hf://org/draft@v1/d.gguf", "--hash", env={"HF_ENDPOINT": hub.endpoint})
        assert r.returncode == 2 and "need a local file" in r.stderr
        served = hub.bytes_served
    r = cli("inspect", "hf://org/draft/d.gguf", env={"HF_ENDPOINT": hub.endpoint})  # the hub is gone now
    assert r.returncode == 5 and "cannot reach" in r.stderr and r.stderr.count("\n") == 1
    r = cli("inspect", "hf://org/d.gguf")
    assert r.returncode == 2 and "expected hf://owner/repo[@revision]/path.gguf" in r.stderr
    assert served == 5 * (64 << 10)  # five header reads of a 2 MB draft, one 64 KiB window each


def test_hf_gated_repo_needs_a_token_and_never_prints_it(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    from dsparkcli.errors import HubError

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # ignore a stored login
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub() as hub:
        hub.add_file("org/gated", "d.gguf", files["draft"].read_bytes())
        hub.gate("org/gated", allowed_tokens=("hf_secret_token_123",))
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        with pytest.raises(HubError, match="gated") as info:
            read_gguf("hf://org/gated/d.gguf")
        assert info.value.exit_code == 5
        monkeypatch.setenv("HF_TOKEN", "hf_secret_token_123")
        h = read_gguf("hf://org/gated/d.gguf")
        assert analysis.census(h).counts() == {"NVFP4": 35, "Q8_0": 3, "F32": 58, "BF16": 1}
        assert all(r.authorized for r in hub.requests if r.status in (200, 206))
        assert "hf_secret_token_123" not in repr(h) and "hf_secret_token_123" not in str(info.value)


def test_split_shard_is_labelled(tmp_path: Path, engine) -> None:
    """A shard written by the engine's own llama-gguf-split says which shard it is."""
    import subprocess

    target = write_target(tmp_path / "t.gguf")
    out = tmp_path / "split"
    subprocess.run(
        [str(engine.tool("llama-gguf-split")), "--split", "--split-max-tensors", "2", str(target), str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    shards = sorted(tmp_path.glob("split-*.gguf"))
    assert len(shards) == 2
    first, second = (analysis.summarize(gc.read_header(p)) for p in shards)
    assert (first.split, second.split) == ("1 of 2", "2 of 2")
    assert sum(analysis.census(gc.read_header(p)).n_tensors for p in shards) == 3
    assert analysis.summarize(gc.read_header(target)).split is None
