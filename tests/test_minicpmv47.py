"""MiniCPM-V 4.7 (issue 31): the stand-in's format, upstream's b11739 libraries on it (the oracle), and an
engine carrying dspark's minicpmv4_7 patch against that oracle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dsparkcli.synth import minicpmv47
from support.scripts import script

IMAGE_TOKEN, SEP_ROWS = "<image>", ("</image>", "<slice>", "</slice>", "\n")
# Agreement with the oracle: same chunk layout and positions exactly; image embeddings and first-token
# logits within these absolute bounds (both run F32/Q8_0 CPU kernels; the wheel's ggml-cpu and ours may pick
# different SIMD paths, so sums may round differently). Measured here (x86-64-v3 build of b11549 + the patch):
# 0.0 for both, bit for bit, at logits of magnitude ~1.4 (the two section orders differ by 4.7e-3 at 112x112).
EMBD_TOL, LOGITS_TOL = 1e-3, 1e-3


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> minicpmv47.Stand47:
    return minicpmv47.write_standin(tmp_path_factory.mktemp("v47"), scale="small", section_order="zyxt")


def _kv(reader, key: str):  # type: ignore[no-untyped-def]
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def test_standin_carries_the_47_facts(standin: minicpmv47.Stand47) -> None:
    import gguf

    target, mmproj = gguf.GGUFReader(standin.target), gguf.GGUFReader(standin.mmproj)
    assert _kv(target, "general.architecture") == "qwen35moe"
    assert _kv(target, "qwen35moe.rope.section_order") == "zyxt"
    assert _kv(mmproj, "clip.projector_type") == "minicpmv4_7"
    assert _kv(mmproj, "clip.minicpmv_version") is None
    for key in ("clip.vision.projector.scale_factor", "clip.vision.max_slice_nums", "clip.vision.wa_layer_indexes"):
        assert _kv(mmproj, key) is not None, key
    (sep,) = [t for t in mmproj.tensors if t.name == "v.tok_embd_sep"]
    (embd,) = [t for t in target.tensors if t.name == "token_embd.weight"]
    tokens = _kv(target, "tokenizer.ggml.tokens")
    vocab = minicpmv47.byte_vocab(len(tokens))
    ids = [vocab.id_of(s) for s in SEP_ROWS]
    assert [tokens[i] for i in ids] == ["</image>", "<slice>", "</slice>", "Ċ"]  # "\n" as its byte-level piece
    rows = gguf.quants.dequantize(embd.data[ids], embd.tensor_type)
    assert np.array_equal(np.asarray(sep.data).reshape(4, -1), rows)  # the converter's copy, bit for bit
    man = json.loads(standin.manifest.read_text())
    assert man["projector"] == "minicpmv4_7" and man["sep_token_ids"] == ids
    # the full-width --shape minicpm-v-4.7-35b-a3b target says the same (one order key, the stand-in's wins)
    from dsparkcli.synth import full_width

    t, _ = full_width.shapes_for("minicpm-v-4.7-35b-a3b")
    assert ("qwen35moe.rope.section_order", "str", "zyxt") in full_width.target_kv(t)
    tyxz = minicpmv47.target_kv(t, minicpmv47.byte_vocab(t.vocab), "tyxz")
    assert [e for e in tyxz if e[0].endswith("section_order")] == [("qwen35moe.rope.section_order", "str", "tyxz")]


def test_synth_refuses_an_unknown_section_order(cli, tmp_path: Path) -> None:
    r = cli("synth", str(tmp_path / "o"), "--shape", "minicpm-v-4.7", "--rope-section-order", "xyzt")
    assert r.returncode != 0 and "unknown rope section order 'xyzt'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def _probe(standin: minicpmv47.Stand47, image: str, lib_dir: Path | None = None) -> dict:
    oracle = script("minicpmv47_oracle")
    return oracle.probe_in_subprocess(lib_dir, standin.manifest, image)


def test_oracle_loads_the_standin_and_lays_out_an_image_as_upstream(standin: minicpmv47.Stand47) -> None:
    """b11739 (llama-cpp-py-sync 0.11739) on the stand-in: the layout dspark's patch reproduces."""
    import gguf

    vocab = minicpmv47.byte_vocab(512)
    (sep_t,) = [t for t in gguf.GGUFReader(standin.mmproj).tensors if t.name == "v.tok_embd_sep"]
    sep = np.asarray(sep_t.data).reshape(4, -1)
    small = _probe(standin, "112x112:0")  # one 2x2-token overview, no slices
    text0, image, _ = small["chunks"]
    assert small["use_mrope"] and text0["tokens"][-1] == vocab.id_of(IMAGE_TOKEN)
    assert image["n_tokens"] == 5 and image["n_pos"] == 2  # 4 image rows + </image>
    p0 = text0["n_pos"]
    base = p0 - 1
    assert image["decoder_pos"] == [
        [p0, base, base, base],
        [p0, base, base + 1, base],
        [p0, base + 1, base, base],
        [p0, base + 1, base + 1, base],
        [p0 + 1] * 4,
    ]
    assert all(len(r) == 256 for r in image["embd"])
    assert np.array_equal(np.asarray(image["embd"][4], dtype=np.float32), sep[0])  # </image> is a row, not a token
    sliced = _probe(standin, "224x224:0")  # overview + 2x2 slices of 2x2 tokens, one chunk
    (img,) = [c for c in sliced["chunks"] if c["type"] == "image"]
    # 5 blocks of 4 rows; separators: </image><slice>, </slice><slice>, </slice>\n<slice>, </slice><slice>, </slice>
    assert img["n_tokens"] == 5 * 4 + 2 + 2 + 3 + 2 + 1 and img["n_pos"] == 5 + 10
    rows = np.asarray(img["embd"], dtype=np.float32)
    for i, s in ((4, 0), (5, 1), (10, 2), (11, 1), (16, 2), (17, 3), (18, 1), (29, 2)):
        assert np.array_equal(rows[i], sep[s]), (i, s)
    assert len(small["logits"]) == 512 and np.isfinite(small["logits"]).all()


def _patched_lib_dir() -> tuple[Path | None, str]:
    """A build with dspark's minicpmv4_7 patch (0009): DSPARK_V47_LIB_DIR, else the default engine, which must
    carry it (None only where no engine is built at all)."""
    if os.environ.get("DSPARK_V47_LIB_DIR"):
        return Path(os.environ["DSPARK_V47_LIB_DIR"]), "DSPARK_V47_LIB_DIR"
    from dsparkcli.errors import DsparkError
    from dsparkcli.llama import engine as engine_mod

    try:
        eng = engine_mod.describe(engine_mod.resolve_engine())
    except DsparkError as exc:
        return None, f"no engine ({exc})"
    mtmd = eng.bin_dir / "libmtmd.so"
    assert mtmd.is_file() and b"minicpmv4_7" in mtmd.read_bytes(), (
        f"the default engine {eng.commit or eng.version} ({eng.bin_dir}) lacks patch 0009: rebuild it "
        "(`dspark engine build`)"
    )
    return eng.bin_dir, f"default engine {eng.commit or eng.version}"


@pytest.mark.parametrize("order", ["zyxt", "tyxz"])
@pytest.mark.parametrize("image", ["112x112:0", "300x200:1", "336x112:4"])
def test_patched_engine_matches_upstream(tmp_path: Path, order: str, image: str) -> None:
    """dspark's patch 0009 (dsparkcli/data/patches/b11549/) against b11739: same layout, embeddings, logits."""
    lib_dir, why = _patched_lib_dir()
    if lib_dir is None:
        pytest.skip(f"needs an engine ({why}): `dspark engine build`")
    files = minicpmv47.write_standin(tmp_path, scale="small", section_order=order)
    oracle = script("minicpmv47_oracle")
    diff = oracle.differences(oracle.probe_in_subprocess(None, files.manifest, image), _probe(files, image, lib_dir))
    print(json.dumps(diff))
    assert diff["same_layout"], diff
    assert max(diff["embd_max_abs"]) <= EMBD_TOL, diff
    assert diff["logits_max_abs"] <= LOGITS_TOL, diff
    assert diff["argmax"][0] == diff["argmax"][1]


def test_registry_pair_states_the_engine_it_needs(user_models, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsparkcli.errors import UsageError
    from dsparkcli.hub.registry import load_registry

    pair = load_registry().get("minicpm-v-4.7")
    assert pair.engine_build == "dspark engine build"
    assert "minicpmv4_7" in pair.engine_needs and "rope.section_order" in pair.engine_needs
    user = user_models(
        '[pairs.tiny.target]\nrepo = "o/t"\nfilename = "t.gguf"\n[pairs.tiny.engine]\nbuild = "make engine"\n'
    ) / "models.toml"  # fmt: skip
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(user.parent))
    with pytest.raises(UsageError, match=rf"^{user}: pairs.tiny.engine.build: must be a `dspark engine build"):
        load_registry()


def test_the_patch_is_0009_of_the_b11549_series_and_applies_alone() -> None:
    """The 4.7 support is patch 0009 of the b11549 series (format-patch of the recorded base, like the
    others), touching no file of 0001-0008, so it also applies alone to the pinned b11549 tree."""
    import subprocess

    from dsparkcli.llama import patches, sources

    series = patches.series_for("b11549") or ()
    patch = series[-1]
    assert patch.name == "0009-mtmd-llama-minicpm-v-4.7.patch" and patch.off_switch == "DSPARK_NO_MINICPMV47"
    base = patches.base_of(patches.SERIES_DIRS["b11549"])
    # format-patch --base writes the base into the series' first patch
    assert base is not None and f"\nbase-commit: {base.base_commit}\n" in series[0].text
    assert not (patches.PATCH_DIR.parent / "patches-4.7").exists()

    def touched(p: patches.Patch) -> set[str]:
        return {fd.path for fd in patches.parse(p)}

    mine = touched(patch)
    assert {"tools/mtmd/mtmd.cpp", "tools/mtmd/clip.cpp", "src/llama-graph.cpp", "src/models/qwen35moe.cpp"} <= mine
    assert not mine & set().union(*(touched(p) for p in series[:-1]))
    tree = sources.sdist_tree(sources.XLLAMACPP)
    path = patches.SERIES_DIRS["b11549"] / patch.name
    check = subprocess.run(["git", "apply", "--check", str(path)], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_off_switch_makes_the_patched_engine_refuse_the_projector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DSPARK_NO_MINICPMV47 (any value): the patched libmtmd refuses minicpmv4_7 as upstream b11549 does."""
    lib_dir, why = _patched_lib_dir()
    if lib_dir is None:
        pytest.skip(f"needs an engine ({why}): `dspark engine build`")
    files = minicpmv47.write_standin(tmp_path, scale="small", section_order="zyxt")
    assert len(_probe(files, "112x112:0", lib_dir)["logits"]) == 512  # on: loads and answers
    monkeypatch.setenv("DSPARK_NO_MINICPMV47", "1")
    with pytest.raises(RuntimeError, match="unknown projector type: minicpmv4_7"):
        _probe(files, "112x112:0", lib_dir)


@pytest.mark.engine
def test_run_answers_an_image_with_the_draft_on_the_patched_engine(cli, tmp_path: Path) -> None:
    """`dspark run image.png "prompt"` on the stand-in (target + minicpmv4_7 mmproj + DSpark draft)."""
    lib_dir, why = _patched_lib_dir()
    if lib_dir is None or not (lib_dir / "llama-server").is_file():
        pytest.skip(f"needs a llama-server with dspark's minicpmv4_7 patch ({why}); see the test above")
    files = minicpmv47.write_standin(tmp_path, scale="small", section_order="zyxt")
    image = minicpmv47.write_png(tmp_path / "img.png", 300, 200, 1)  # overview + 3x2 slices
    args = ["run", str(image), "What is in the image?", "--target", str(files.target), "--mmproj", str(files.mmproj)]
    r = cli(*args, "--draft", str(files.draft), "--llama-bin", str(lib_dir / "llama-server"), "-n", "16")
    assert r.returncode == 0, r.stderr
    assert "| 16 tokens |" in r.stdout + r.stderr and "drafted " in r.stdout + r.stderr


def test_full_width_shapes_fit_the_46_graph() -> None:
    """--width full (the H200's): the real text tower, SigLIP-400M widths, projector output = text width."""
    t, d, v = minicpmv47.shapes("full")
    assert (t.arch, t.n_layer, t.n_embd, t.vocab, d.vocab) == ("qwen35moe", 40, 2048, 248_144, 248_144)
    assert (v.n_embd, v.n_layer, v.patch_size, v.image_size, v.scale_factor) == (1152, 27, 14, 448, 4)
    assert 0 <= v.insert_layer < v.n_layer and (v.image_size // v.patch_size) % v.scale_factor == 0
    kv = dict((k, val) for k, _, val in minicpmv47.mmproj_kv(v, t.n_embd))
    assert kv["clip.projector_type"] == "minicpmv4_7" and kv["clip.vision.projection_dim"] == 2048
    assert minicpmv47.byte_vocab(t.vocab).tokens[d.mask_token_id].startswith("<|fill_")  # a token no text makes


@pytest.mark.engine
def test_fetch_and_run_minicpm_v_47_from_the_hub_on_the_default_engine(cli, tmp_path: Path) -> None:
    """The registry's pair, served by a local hub under its real names with 4.7 headers (qwen35moe with
    rope.section_order, a minicpmv4_7 mmproj with v.tok_embd_sep, the DSpark draft; small widths): `dspark fetch
    minicpm-v-4.7` passes the engine check on the default engine and `dspark run image.png "prompt" --model
    minicpm-v-4.7` answers with the draft (before patch 0009, the check refused the projector)."""
    from dsparkcli.hub.registry import load_registry
    from support.hubserver import FakeHub

    pair = load_registry().get("minicpm-v-4.7")
    files = minicpmv47.write_standin(tmp_path / "src", scale="small", section_order="zyxt")
    draft_name = "MiniCPM-V-4.7-35B-A3B-DSpark-Q8_0.gguf"  # the q8_0 key's glob, *Q8_0*.gguf, finds it
    served = {
        (pair.target.repo, pair.target.filename): files.target,
        (pair.mmproj.repo, pair.mmproj.filename): files.mmproj,
        (pair.drafts["q8_0"].repo, draft_name): files.draft,
    }
    image = minicpmv47.write_png(tmp_path / "img.png", 300, 200, 1)
    with FakeHub() as hub:
        for (repo, name), path in served.items():
            hub.add_file(repo, name, path.read_bytes())
        env = {**hub.client_env(tmp_path / "hf"), "DSPARK_CONFIG_DIR": str(tmp_path / "cfg")}
        r = cli("fetch", "minicpm-v-4.7", "--yes", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert [f["action"] for f in json.loads(r.stdout)["files"]] == ["downloaded"] * 3
        r = cli("run", str(image), "What is in the image?", "--model", "minicpm-v-4.7", "-n", "16", env=env)
    assert r.returncode == 0, r.stderr
    assert "| 16 tokens |" in r.stdout + r.stderr and "drafted " in r.stdout + r.stderr
