"""Will this engine load these files? The engine's own name tables (archs, mtmd projector types, ggml
tensor types), read from the source tree of the pinned build and from its shared libraries; the checks
that refuse a file before launch, and before download over the local hub (header bytes only, through the
real huggingface_hub client)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from dsparkcli import pairs
from dsparkcli.errors import EngineCapabilityError
from dsparkcli.gguf.pairing import check_pair
from dsparkcli.gguf.reader import ggml_types, read_header
from dsparkcli.hub import fetch as hub_fetch
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import loads, tables
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.pairs import Downloads, PairSpec, ServerKnobs, prepare_server
from dsparkcli.synth import known_answer as synth
from support import gguf_fixtures as fx
from support.cli import run_cli
from support.hubserver import FakeHub

REMOVED_TYPE_IDS = {4, 5, 31, 32, 33, 36, 37, 38}  # ggml.h: "support has been removed"
TYPE_IDS = {name: tid for tid, (name, _, _) in ggml_types().items()}
# a projector type no llama.cpp names (the default engine loads minicpmv4_7 through dspark's patch 0009)
UNKNOWN_PROJECTOR = "minicpmv5_0"


@pytest.fixture(scope="module")
def record(engine):
    found = loads.build_record(engine)
    assert found is not None, "the test engine is a dspark build"
    return found[1]


@pytest.fixture(scope="module")
def source_tables(record):
    return tables.from_source(Path(record.compiled_source))  # the patched copy: 0009 adds minicpmv4_7


def test_the_pinned_engines_tables_from_its_source_tree(engine, source_tables):
    t = loads.engine_tables(engine)
    assert t is not None and t.origin == "source" and t.backend == "cpu"
    assert (t.archs, t.projectors, t.tensor_types) == (
        source_tables.archs,
        source_tables.projectors,
        source_tables.tensor_types,
    )
    # b11549 + dspark's 0009: 156 archs (clip included, "(unknown)" not), 67 projector types (upstream's 66 +
    # minicpmv4_7), 35 loadable ggml types
    assert (len(t.archs), len(t.projectors), len(t.tensor_types)) == (156, 67, 35)
    assert {"qwen35", "qwen35moe", "dflash", "llama", "clip"} <= set(t.archs)
    assert {"minicpmv4_6", "resampler", "mlp", "qwen2.5o"} <= set(t.projectors)
    assert "minicpmv4_7" in t.projectors and UNKNOWN_PROJECTOR not in t.projectors and "(unknown)" not in t.archs
    assert dict(zip(t.tensor_types, t.tensor_type_ids))["NVFP4"] == 40
    assert set(t.tensor_type_ids) == set(range(43)) - REMOVED_TYPE_IDS
    assert t.knows_type(40, "NVFP4") and not t.knows_type(4, "type#4") and not t.knows_type(43, "type#43")


def test_the_shared_libraries_give_no_false_no(engine, source_tables):
    """A user's binary is read from its libraries' strings: every name of the pinned tables is found,
    nothing outside them is, and the tensor types (a closed, numbered set) come out exactly."""
    t = tables.from_libraries(engine.bin_dir, engine.server, TYPE_IDS)
    assert t.origin == "libraries" and Path(dict(t.libraries)["projectors"]).name.startswith("libmtmd")
    assert all(t.knows_arch(a) for a in source_tables.archs)
    assert all(t.knows_projector(p) for p in source_tables.projectors)
    assert t.tensor_types == source_tables.tensor_types
    for name in (UNKNOWN_PROJECTOR, "qwen99moe", "minicpmv47"):
        assert not t.knows_arch(name) and not t.knows_projector(name)
    assert t.knows_type(99, "type#99") is None  # no name for the id: the strings cannot be asked
    # the listing (what doctor shows) is the table's run of strings: nearly all of it
    assert len(set(t.archs) & set(source_tables.archs)) >= 140 and len(set(t.archs) - set(source_tables.archs)) <= 2
    assert (
        set(source_tables.projectors) <= set(t.projectors)
        and len(set(t.projectors) - set(source_tables.projectors)) <= 2
    )


def _tree_copy(src: Path, dst: Path) -> Path:
    for rel in (tables.ARCH_SOURCE, tables.PROJECTOR_SOURCE, tables.TYPE_ENUM_SOURCE, tables.TYPE_TRAITS_SOURCE):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, dst / rel)
    return dst


def _fake_build(cache: Path, engine, source: Path) -> None:
    """A build record in an isolated cache whose binaries are the real ones and whose tree is ``source``."""
    root = cache / "engine" / "test-cpu"
    root.mkdir(parents=True)
    (root / "engine.json").write_text(
        json.dumps(
            {
                "commit": "test123",
                "backend": "cpu",
                "cuda_arch": "",
                "source_dir": str(source),
                "bin_dir": str(engine.bin_dir),
                "targets": [],
            }
        )
    )


def test_tables_are_cached_with_the_record_and_follow_the_tree(engine, record, tmp_path, monkeypatch):
    tree = _tree_copy(Path(record.source_dir), tmp_path / "llama.cpp")
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    _fake_build(tmp_path / "cache", engine, tree)
    eng = engine_mod.Engine(engine.server, engine.bin_dir, "flag")  # found by its folder, however it was named
    first = loads.engine_tables(eng)
    assert first is not None and first.origin == "source" and first.where == str(tree)
    cached = json.loads((tmp_path / "cache" / "engine" / "test-cpu" / "tables.json").read_text())
    assert cached["projectors"] == list(first.projectors) and len(cached["inputs"]) == 4

    def boom(*a, **k):
        raise AssertionError("read again")

    with monkeypatch.context() as m:  # a second look is the cache's
        m.setattr(tables, "from_source", boom)
        assert loads.engine_tables(eng) == first
    # a newer tree (here: one that names a projector no release has yet) is read again
    header = tree / tables.PROJECTOR_SOURCE
    text = header.read_text().replace(
        '{ PROJECTOR_TYPE_MINICPMV4_6,       "minicpmv4_6"},',
        '{ PROJECTOR_TYPE_MINICPMV4_6,       "minicpmv4_6"},\n    { PROJECTOR_TYPE_MINICPMV5_0, "minicpmv5_0"},',
    )
    header.write_text(text)
    newer = loads.engine_tables(eng)
    assert (
        newer is not None
        and UNKNOWN_PROJECTOR in newer.projectors
        and len(newer.projectors) == len(first.projectors) + 1
    )
    # the tree gone: the shared libraries answer instead
    shutil.rmtree(tree)
    fallback = loads.engine_tables(eng)
    assert fallback is not None and fallback.origin == "libraries" and fallback.knows_projector("minicpmv4_6")


# ------------------------------------------------------------------ refused before launch


def retype(path: Path, tensor: str, type_id: int) -> Path:
    """Rewrite one tensor's ggml type id in place (a type the engine's table does not have)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<i", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("good"), vocab=128, accept_rate=1.0, seed=3)


@pytest.fixture
def bad(tmp_path, good):
    """Three files the pinned engine cannot load, one reason each."""
    arch = fx.write_target(tmp_path / "qwen99.gguf", arch="qwen99moe")
    mmproj = fx.write_mmproj(tmp_path / "mmproj-47.gguf", projector=UNKNOWN_PROJECTOR)
    typed = retype(Path(shutil.copy(good.target, tmp_path / "typed.gguf")), "output_norm.weight", 43)
    return {"arch": arch, "mmproj": mmproj, "typed": typed}


def test_each_unloadable_file_is_named_with_what_to_do(engine, bad, good):
    t = loads.engine_tables(engine)
    verdict = check_pair(bad["arch"], tables=t)
    [c] = [c for c in verdict.checks if c.name == "engine: target arch"]
    assert (
        c.ok is False
        and c.file == "qwen99.gguf"
        and "'qwen99moe' is not in the engine's arch table (156 names)" in c.detail
    )
    verdict = check_pair(good.target, mmproj=bad["mmproj"], tables=t)
    [c] = [c for c in verdict.checks if c.name == "engine: mmproj projector"]
    assert c.ok is False and f"'{UNKNOWN_PROJECTOR}' is not in the engine's projector table (67 names)" in c.detail
    assert verdict.ok is False
    [c] = [c for c in check_pair(bad["typed"], tables=t).checks if c.name == "engine: target tensor types"]
    assert c.ok is False and c.detail.startswith("type#43 x1 not in the engine's ggml type table (35 types)")
    ok = check_pair(good.target, good.draft, tables=t)
    assert ok.ok, ok.reasons
    assert [c.ok for c in ok.checks if c.name.startswith("engine: ")] == [True] * 4


@pytest.mark.parametrize("which", ["arch", "mmproj", "typed"])
def test_launch_refuses_before_any_process(engine, bad, good, which, tmp_path):
    cfg = ServerConfig(
        model=good.target if which == "mmproj" else bad[which],
        mmproj=bad["mmproj"] if which == "mmproj" else None,
        threads=2,
        ctx=256,
    )
    srv = LlamaServer(engine, cfg, log_dir=tmp_path / "logs")
    with pytest.raises(EngineCapabilityError) as info:
        srv.start()
    assert srv.process is None and not (tmp_path / "logs").exists()  # nothing was launched
    text = str(info.value)
    assert "\n" not in text and text.startswith("the engine llama.cpp b11549 cannot load ")
    assert "dspark engine build --source <llama.cpp checkout that has it>" in text


def test_pairs_refuse_the_same_before_the_server(engine, bad, good):
    with pytest.raises(EngineCapabilityError, match=UNKNOWN_PROJECTOR):
        prepare_server(
            PairSpec(target=good.target, mmproj=bad["mmproj"], no_draft=True), ServerKnobs(), Downloads(engine=engine)
        )
    cfg, _ = prepare_server(PairSpec(target=good.target, draft=good.draft), ServerKnobs(), Downloads(engine=engine))
    assert cfg.draft == good.draft


@pytest.mark.engine  # the built engine's tables refuse the file: `dspark run` finds that engine by itself
def test_cli_run_refuses_in_one_line(bad, tmp_path):
    r = run_cli(
        "run", "--target", str(bad["arch"]), "--no-draft", "hello", env={"DSPARK_CONFIG_DIR": str(tmp_path / "cfg")}
    )
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "dspark: error: the engine llama.cpp b11549 cannot load qwen99.gguf"
    )
    assert "Traceback" not in r.stderr


def test_fp4_on_a_build_without_native_fp4_gets_advice_not_a_refusal(engine, tmp_path):
    t = loads.engine_tables(engine)
    draft = fx.write_draft(tmp_path / "d.gguf")  # 35 NVFP4 tensors, like the real NVFP4A16 draft
    for arch, advice in (("90", True), ("120", False), ("", False)):
        cuda = dataclasses.replace(t, backend="cuda", cuda_arch=arch)
        checks = {c.name: c for c in check_pair(fx.write_target(tmp_path / "t.gguf"), draft, tables=cuda).checks}
        assert checks["engine: draft tensor types"].ok is True
        assert ("engine: draft FP4 speed" in checks) is advice
        if advice:
            c = checks["engine: draft FP4 speed"]
            assert c.ok is None and "35 FP4 tensors" in c.detail and "sm_90" in c.detail and "--draft q8_0" in c.detail
    cpu = {c.name for c in check_pair(tmp_path / "t.gguf", draft, tables=t).checks}
    assert "engine: draft FP4 speed" not in cpu


# ------------------------------------------------------------------ refused before download


TARGET_REPO, DRAFT_REPO = "esatapedico/MiniCPM-V-4.7-35B-A3B-NVFP4-GGUF", "openbmb/MiniCPM-V-4.7-35B-A3B-DSpark-gguf"
TARGET_FILE, MMPROJ_FILE = "MiniCPM-V-4.7-35B-A3B-NVFP4-MEDIUM.gguf", "mmproj-MiniCPM-V-4.7-35B-A3B.gguf"
DRAFT_FILE = "MiniCPM-V-4.7-35B-A3B-DSpark-Q8_0.gguf"


@pytest.fixture
def hub():
    with FakeHub() as fake:
        yield fake


def _hub_env(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    return {**hub.client_env(tmp_path / "hf"), "DSPARK_CONFIG_DIR": str(tmp_path / "cfg")}


def _serve_minicpm(hub: FakeHub, tmp_path: Path, projector: str) -> dict[str, bytes]:
    """The registry's minicpm-v-4.7 repos with small synthetic files (the real names; the target claims 20 GB)."""
    files = {
        (TARGET_REPO, TARGET_FILE): fx.write_target(tmp_path / "t.gguf", vocab=4000, embd=1024).read_bytes(),
        (TARGET_REPO, MMPROJ_FILE): fx.write_mmproj(tmp_path / "m.gguf", projector=projector).read_bytes(),
        (DRAFT_REPO, DRAFT_FILE): fx.write_draft(tmp_path / "d.gguf", fx.DraftSpec(vocab=4000)).read_bytes(),
    }
    for (repo, path), data in files.items():
        hub.add_file(repo, path, data)
    return files


@pytest.mark.engine  # the built engine's projector table refuses the file: `dspark fetch` finds that engine
def test_fetch_stops_after_the_headers_when_the_projector_is_unknown(hub, tmp_path):
    files = _serve_minicpm(hub, tmp_path, projector=UNKNOWN_PROJECTOR)
    hub.advertise_size(TARGET_REPO, TARGET_FILE, 20 * 10**9)
    r = run_cli("fetch", "minicpm-v-4.7", env=_hub_env(tmp_path, hub))
    assert r.returncode == 3, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("dspark: error:")]
    assert errors == [ln for ln in r.stderr.splitlines() if "error" in ln] and len(errors) == 1
    line = errors[0]
    assert (
        f"the engine llama.cpp b11549 cannot load {MMPROJ_FILE}: projector type '{UNKNOWN_PROJECTOR}' is not in "
        "the engine's projector table (67 names)"
    ) in line
    # the registry's [pairs."minicpm-v-4.7".engine] names the one command that builds a fitting engine
    assert "(build one that can: dspark engine build; --force downloads them anyway)" in line
    assert "20.0 GB" in r.stderr  # the plan was shown first
    # header bytes only: every file GET was a range request, and far fewer bytes than the files hold
    gets = [q for q in hub.requests if q.method == "GET" and "/resolve/" in q.path]
    assert gets and all(q.range for q in gets)
    # the reader asks for 64 KiB, then doubles until the header is in: under 3x each header (or 64 KiB)
    bound = sum(max(64 << 10, 3 * read_header(tmp_path / n).data_offset) for n in ("t.gguf", "m.gguf", "d.gguf"))
    assert hub.bytes_served <= bound, (hub.bytes_served, bound)
    assert hub.bytes_served < sum(len(d) for d in files.values()) / 10
    assert not list((tmp_path / "hf").rglob("*.gguf")) and not list((tmp_path / "hf").rglob("*.incomplete"))


def test_fetch_force_downloads_anyway_and_a_loadable_pair_is_fetched(hub, tmp_path):
    files = _serve_minicpm(hub, tmp_path, projector=UNKNOWN_PROJECTOR)
    env = _hub_env(tmp_path, hub)
    r = run_cli("fetch", "minicpm-v-4.7", "--force", "--yes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert hub.bytes_served == sum(len(d) for d in files.values())  # no header read: straight to the bytes
    assert [f["action"] for f in json.loads(r.stdout)["files"]] == ["downloaded"] * 3

    hub.add_file(TARGET_REPO, MMPROJ_FILE, fx.write_mmproj(tmp_path / "m2.gguf", projector="minicpmv4_6").read_bytes())
    r = run_cli("fetch", "minicpm-v-4.7", "--yes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [f["action"] for f in json.loads(r.stdout)["files"]] == ["present", "downloaded", "present"]


def _settled(hub, quiet_s: float = 0.3, limit_s: float = 10.0) -> int:
    """bytes_served once the server threads stopped counting (unchanged for ``quiet_s``)."""
    deadline = time.monotonic() + limit_s
    last = -1
    while hub.bytes_served != last and time.monotonic() < deadline:
        last = hub.bytes_served
        time.sleep(quiet_s)
    return last


def test_run_checks_the_remote_headers_before_fetching(hub, tmp_path, engine, good):
    _serve_minicpm(hub, tmp_path, projector=UNKNOWN_PROJECTOR)
    env = _hub_env(tmp_path, hub)
    for key, value in env.items():
        os.environ[key] = value  # hub.fetch reads HF_* at call time
    try:
        with pytest.raises(EngineCapabilityError, match=f"projector type '{UNKNOWN_PROJECTOR}'") as info:
            prepare_server(PairSpec(model="minicpm-v-4.7"), ServerKnobs(), Downloads(yes=True, engine=engine))
        assert "--force" in str(info.value)
        assert not list((tmp_path / "hf").rglob("*.gguf"))
        served = _settled(hub)  # the server thread counts a body once it has written it: let it finish
        # an hf:// mmproj next to local files: the same check, header only
        with pytest.raises(EngineCapabilityError, match=UNKNOWN_PROJECTOR):
            prepare_server(
                PairSpec(target=good.target, mmproj=f"hf://{TARGET_REPO}/{MMPROJ_FILE}", no_draft=True),
                ServerKnobs(),
                Downloads(yes=True, engine=engine),
            )
        assert _settled(hub) - served == 64 * 1024  # one first chunk: the mmproj header is 384 bytes
    finally:
        for key in env:
            os.environ.pop(key, None)


def test_fp4_advice_before_download_names_the_files_to_use_instead(hub, tmp_path, engine, monkeypatch):
    """On a CUDA build without native FP4 (the H200's sm_90), an NVFP4 draft is fetched with advice (the
    served draft is a stand-in with the NVFP4A16 file's layout)."""
    _serve_minicpm(hub, tmp_path, projector="minicpmv4_6")
    for key, value in _hub_env(tmp_path, hub).items():
        monkeypatch.setenv(key, value)
    hopper = dataclasses.replace(loads.engine_tables(engine), backend="cuda", cuda_arch="90")
    monkeypatch.setattr(pairs, "engine_tables", lambda _engine: hopper)
    planned = hub_fetch.plan(load_registry().get("minicpm-v-4.7"))
    advice: list = []
    pairs.engine_check(engine, on_advice=advice.append)(planned)
    assert [(c.file, c.name) for c in advice] == [(DRAFT_FILE, "engine: draft FP4 speed")]
    assert "use a Q8_0/Q6_K/Q4_K GGUF instead (the registry's drafts: --draft q8_0 or q6_k)" in advice[0].detail
    assert not list((tmp_path / "hf").rglob("*.gguf"))


# ------------------------------------------------------------------ doctor


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_doctor_shows_counts_and_json_lists(tmp_path):
    r = run_cli("doctor", env={"DSPARK_CONFIG_DIR": str(tmp_path / "cfg")})
    assert r.returncode == 0, r.stderr
    assert "156 archs, 67 projector types, 35 tensor types (from the source tree" in " ".join(r.stdout.split())
    r = run_cli("doctor", "--json", env={"DSPARK_CONFIG_DIR": str(tmp_path / "cfg")})
    doc = json.loads(r.stdout)
    loads = doc["loads"]
    assert loads["origin"] == "source" and len(loads["archs"]) == 156 and "qwen35moe" in loads["archs"]
    assert {"minicpmv4_6", "minicpmv4_7"} <= set(loads["projectors"]) and "NVFP4" in loads["tensor_types"]
