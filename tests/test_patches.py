"""dspark's llama.cpp patch series and the adaptive budget's model, without a compiler.

The series applies to the pinned tree (checked on a copy of the files it touches), a stock build keeps
its old cache key and is still found and reused, the applier is strict and leaves nothing half-written,
and ``budget.rule`` (the engine's choice, replayed in Python) behaves as its docstring says, by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from dsparkcli.budget import rule as budget
from dsparkcli.budget.model import CostModel, cost_table
from dsparkcli.errors import EngineBuildError
from dsparkcli.llama import building, patches, sources
from dsparkcli.llama import engine as engine_mod


def pinned_tree() -> Path:
    tree = sources.sdist_tree_dir(sources.DEFAULT_SDIST)
    assert (tree / "CMakeLists.txt").is_file(), "the pinned llama.cpp tree is missing: run `dspark engine build`"
    return tree


def touched_copy(tmp_path: Path) -> Path:
    """The files the series touches, copied from the pinned tree (a full copy is 176 MB)."""
    dest = tmp_path / "tree"
    for p in patches.shipped():
        for fd in patches.parse(p):
            (dest / fd.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pinned_tree() / fd.path, dest / fd.path)
    return dest


def test_the_shipped_series_applies_to_the_pinned_tree_in_order(tmp_path):
    series = patches.shipped()
    assert [p.number for p in series] == ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009"]
    assert series[0].summary == "server: per-request speculative.n_max, n_min, p_min"
    assert series[1].summary.startswith("speculative: --spec-draft-n-max auto")
    assert series[2].summary == "speculative: a DFlash/DSpark draft's block follows the request's n_max"
    assert series[3].summary == "delta-net: copy only the conv-state snapshots a rollback of this batch can read"
    h = patches.series_hash(series)
    assert len(h) == 8 and h == patches.series_hash(patches.shipped()) and patches.series_hash(()) == ""
    assert patches.series_hash(series[:1]) != h
    tree = touched_copy(tmp_path)
    before = (pinned_tree() / "tools/server/server-schema.cpp").read_bytes()
    changed = [path for p in series for path in patches.apply(tree, p)]
    assert "tools/server/server-schema.cpp" in changed and "common/speculative.cpp" in changed
    schema = (tree / "tools/server/server-schema.cpp").read_text()
    assert '"speculative.n_max"' in schema and "#if 0\n    // TODO: for now" not in schema
    assert "common_speculative_budget_choose" in (tree / "common/speculative.cpp").read_text()
    assert "std::min<int64_t>(K, n_new)" in (tree / "src/models/delta-net-base.cpp").read_text()
    assert "--spec-cost-table" in (tree / "common/arg.cpp").read_text()
    assert "ne11 <= (stock ? 3 : MMVF_MAX_BATCH_SIZE)" in (tree / "ggml/src/ggml-cuda/mmvf.cu").read_text()
    assert "argmax_f32_split<<<" in (tree / "ggml/src/ggml-cuda/argmax.cu").read_text()
    assert (pinned_tree() / "tools/server/server-schema.cpp").read_bytes() == before  # never in place
    # applied twice: the old lines are gone, so it refuses (one line) and writes nothing
    snapshot = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    with pytest.raises(EngineBuildError, match=r"does not apply to .* \(hunk 1 at line \d+\)"):
        patches.apply(tree, series[0])
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == snapshot


PATCH = """Subject: [PATCH] demo
 folded subject

--- a/a.txt
+++ b/a.txt
@@ -2,3 +2,3 @@
 two
-three
+THREE
 four
@@ -9,2 +9,3 @@
 nine
 ten
+eleven
--- /dev/null
+++ b/new/b.txt
@@ -0,0 +1,2 @@
+hello
+world
"""


def test_apply_is_strict_finds_moved_code_and_creates_files(tmp_path):
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / "a.txt").write_text("".join(f"{w}\n" for w in "one two three four five six seven eight nine ten".split()))
    p = patches.Patch("0001-demo.patch", PATCH)
    assert p.summary == "demo folded subject"
    dest = patches.patched_copy(src, tmp_path / "copy", (p,))
    assert (dest / "a.txt").read_text().split() == "one two THREE four five six seven eight nine ten eleven".split()
    assert (dest / "new/b.txt").read_text() == "hello\nworld\n"
    assert not (dest / ".git").exists() and (src / "a.txt").read_text().count("three") == 1
    assert (dest / patches.MARKER).read_text().strip() == patches.series_hash((p,))
    assert patches.patched_copy(src, tmp_path / "copy", (p,)) == dest  # made once per series
    # code moved by two lines (a user's --source tree): found at its one other place
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "a.txt").write_text("x\ny\n" + (src / "a.txt").read_text())
    patches.apply(moved, p)
    assert (moved / "a.txt").read_text().split()[:5] == ["x", "y", "one", "two", "THREE"]
    # a tree it does not fit: nothing half-written, no copy left behind
    (src / "a.txt").write_text("something else\n")
    with pytest.raises(EngineBuildError, match="does not apply to a.txt"):
        patches.patched_copy(src, tmp_path / "copy2", (p,))
    assert not (tmp_path / "copy2").exists() and not (tmp_path / "copy2.partial").exists()
    with pytest.raises(EngineBuildError, match="outside the tree"):
        patches.apply(src, patches.Patch("evil.patch", "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n"))


def _fake_build(root: Path, key: str, source: Path, **record) -> Path:
    bin_dir = root / "engine" / key / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in (*engine_mod.BUILD_TARGETS, engine_mod.RPC_SERVER):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    rec = {
        "commit": "b11549",
        "backend": "cpu",
        "cuda_arch": "",
        "source_dir": str(source),
        "bin_dir": str(bin_dir),
        "targets": list(building.build_targets(True)),
        "cpu_arch": "x86-64-v3",
        "rpc": True,
        **record,
    }
    (root / "engine" / key / "engine.json").write_text(json.dumps(rec))
    return bin_dir


def test_stock_and_patched_builds_live_side_by_side(tmp_path, monkeypatch):
    """`--no-patches` keeps the stock key and is reused from the cache; the default build is patched,
    keyed by the series hash; resolution prefers the build with the shipped series."""
    source = pinned_tree().resolve()  # before the cache moves
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    for var in ("DSPARK_LLAMA_BIN", "DSPARK_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    h = patches.series_hash(patches.shipped())
    # the pinned sdist has no git metadata: its key starts with the release
    stock_key = engine_mod.build_key("b11549", "cpu", rpc=True)
    assert (
        stock_key == "b11549-cpu-x86-64-v3-rpc"
        and engine_mod.build_key("b11549", "cpu", rpc=True, patch_hash=h) == f"b11549-cpu-x86-64-v3-rpc-p{h}"
    )
    stock_bin = _fake_build(tmp_path, stock_key, source)
    eng, rec, reused = building.build_engine(source=source, patches=False)
    assert reused and eng.bin_dir == stock_bin and rec.patch_hash == "" and rec.compiled_source == str(source)
    assert engine_mod.resolve_engine().bin_dir == stock_bin  # the only one
    old_bin = _fake_build(
        tmp_path, f"{stock_key}-p00000000", source, patches=["0001-old.patch"], patch_hash="00000000"
    )
    assert engine_mod.resolve_engine().bin_dir == old_bin  # patched beats stock
    new_bin = _fake_build(
        tmp_path,
        f"{stock_key}-p{h}",
        source,
        patches=[p.name for p in patches.shipped()],
        patch_hash=h,
        build_source=str(tmp_path / "engine" / f"{stock_key}-p{h}" / "src"),
    )
    assert engine_mod.resolve_engine().bin_dir == new_bin  # the shipped series beats an older one
    eng, rec, reused = building.build_engine(source=source, patches=True)
    assert reused and eng.bin_dir == new_bin and rec.compiled_source.endswith("/src")
    # a user's --source gets the series only when asked: without --patches it is the stock key
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "CMakeLists.txt").write_text("")
    commit = sources.source_commit(mine)
    _fake_build(tmp_path, engine_mod.build_key(commit, "cpu", rpc=True), mine.resolve())
    eng, rec, reused = building.build_engine(source=mine)
    assert reused and rec.patch_hash == "" and not rec.patches


# ------------------------------------------------------------------ the adaptive budget's model, by hand


def test_cost_table_round_trip_matches_tunes_cost_model():
    cost = CostModel(t1_ms=4.431, t_step_ms=((1, 6.89), (3, 9.75), (7, 13.66)), s_ms=0.561)
    table = budget.parse_cost_table(cost_table(cost))
    assert table.max_k == 7 and table.accept_ms == 0.561
    assert table.step_ms[0] == 4.431 and table.step_ms[1] == 6.89 and table.step_ms[3] == 9.75
    for k in range(1, 8):  # the engine's fill equals tune's interpolation
        assert table.step_ms[k] == pytest.approx(cost.step(k), rel=1e-12)
    assert budget.CostTable.from_points({0: 10.0, 3: 12.0}).step_ms == (10.0, 12.0, 12.0, 12.0)  # below: clamped


def test_choice_decay_and_reprobe_by_hand():
    table = budget.CostTable((10.0, 15.0, 18.0, 21.0), 0.0)
    est = budget.Estimate()
    # no data: r = 0.8 everywhere; E = 0.8, 1.44, 1.952 -> values 1.8/15, 2.44/18, 2.952/21 vs 1/10
    vals = budget.values(est, table, 3)
    assert vals == pytest.approx([0.1, 1.8 / 15, 2.44 / 18, 2.952 / 21])
    k, est = budget.choose(est, table, 3)
    assert k == 3 and est.reach == (0.0, 0.0, 0.0)
    assert budget.choose(budget.Estimate(), table, 2)[0] == 2  # the cap
    # a rejected first position: reach[0] = 1, acc[0] = 0 -> r0 = 0.4: 1.4/15, 1.72/18, 1.976/21 < 0.1
    est = budget.accept(est, 3, 0)
    assert (est.reach, est.acc) == ((1.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    assert budget.choose(est, table, 3)[0] == 0
    # plain steps decay the evidence back to the prior: r0 = 0.8 / (1 + 0.95^n); k = 2 pays once
    # (1 + 1.8 r0) / 18 > 0.1, i.e. 0.95^n < 0.8: n = 5 (r0 = 0.451; k = 3 then 0.1000 < k = 2's 0.1007)
    steps = 0
    while (k := budget.choose(est, table, 3)[0]) == 0:
        _, est = budget.choose(est, table, 3)
        steps += 1
    assert steps == 5 and k == 2 and est.reach[0] == pytest.approx(0.95**5)
    # accepted positions raise their own rates only
    est = budget.accept(budget.Estimate(), 3, 2)
    assert (est.reach, est.acc) == ((1.0, 1.0, 1.0), (1.0, 1.0, 0.0))
    assert [round(est.rate(i), 6) for i in range(4)] == [0.9, 0.9, 0.4, 0.8]
    # a tie (within TIE) goes to the smaller k: 1.8/18 == 2.44/24.4
    assert budget.choose(budget.Estimate(), budget.CostTable((20.0, 18.0, 24.4)), 2)[0] == 1
    assert budget.margin(budget.Estimate(), budget.CostTable((20.0, 18.0, 24.4)), 2) < 1e-8
    assert budget.margin(budget.Estimate(), table, 3) > 0.01


def test_the_pinned_tree_unpacked_elsewhere_is_patched_by_default(tmp_path, monkeypatch):
    """A GPU bundle unpacks the pinned tree in its sdist layout and builds it with --source: the series
    applies (any other --source tree is stock unless --patches)."""
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("DSPARK_LLAMA_BIN", raising=False)
    sdist = sources.DEFAULT_SDIST
    bundle = tmp_path / "gpu" / sdist.top / sdist.subdir  # xllamacpp-2026.10.11549/thirdparty/llama.cpp
    bundle.mkdir(parents=True)
    (bundle / "CMakeLists.txt").write_text("")
    assert sources.source_commit(bundle) == sdist.label == "b11549"  # no commit known: the release names it
    h = patches.series_hash(patches.shipped())
    _fake_build(
        tmp_path / "cache",
        engine_mod.build_key(sdist.label, "cpu", rpc=True, patch_hash=h),
        bundle.resolve(),
        patches=[p.name for p in patches.shipped()],
        patch_hash=h,
    )
    eng, rec, reused = building.build_engine(source=bundle)
    assert reused and rec.patch_hash == h


def test_each_off_switch_is_the_variable_its_code_reads(tmp_path):
    """A patch that says ``DSPARK_X=1`` turns it off must read exactly that variable in what it adds, and
    doctor names a switch set in the environment: a renamed variable would make a measurement of the
    patch "off" silently measure it on."""
    for series in (patches.series_for("b11312"), patches.shipped()):
        assert series is not None
        _check_off_switches(series)


def _check_off_switches(series: tuple[patches.Patch, ...]) -> None:
    switches = {
        "0001": None,
        "0002": None,
        "0003": None,
        "0004": "DSPARK_COPY_ALL_SNAPSHOTS",
        "0005": "DSPARK_NO_DEFER",
        "0006": "DSPARK_STOCK_MMVF",
        "0007": "DSPARK_STOCK_ARGMAX",
        "0008": None,
        "0009": "DSPARK_NO_MINICPMV47",  # b11549's only: off = upstream b11549's refusal of the 4.7 projector
    }
    assert {p.number: p.off_switch for p in series} == {n: v for n, v in switches.items() if n <= series[-1].number}
    diagnostics = {"0008": {"DSPARK_CUDA_GRAPH_STATS"}}  # variables that only log, named in the description
    for p in series:
        added = "\n".join(line for fd in patches.parse(p) for h in fd.hunks for line in h.new if line not in h.old)
        read = set(re.findall(r'getenv\("(DSPARK_[A-Z0-9_]+)"\)', added))
        logs_only = diagnostics.get(p.number, set())
        assert all(v in p.description for v in logs_only), p.name
        assert read == ({p.off_switch} if p.off_switch else set()) | logs_only, p.name
    names = [p.name for p in series]
    assert patches.switches_off(names, {}) == []
    assert patches.switches_off(names, {"DSPARK_STOCK_MMVF": "1", "DSPARK_NO_DEFER": "1", "OTHER": "1"}) == [
        "0005 (DSPARK_NO_DEFER=1)",
        "0006 (DSPARK_STOCK_MMVF=1)",
    ]
    assert patches.switches_off(names[:4], {"DSPARK_STOCK_MMVF": "1"}) == []  # a build without 0006
    # the engine reads getenv(...) != nullptr: any value, "0" and "" included, turns the patch off
    assert patches.switches_off(names, {"DSPARK_STOCK_ARGMAX": "0", "DSPARK_COPY_ALL_SNAPSHOTS": ""}) == [
        "0004 (DSPARK_COPY_ALL_SNAPSHOTS=)",
        "0007 (DSPARK_STOCK_ARGMAX=0)",
    ]


def test_doctor_names_the_patches_the_environment_turns_off(monkeypatch):
    from dsparkcli.doctor import patch_line

    series = patches.shipped()
    report = type(
        "R",
        (),
        {"patches": tuple(p.name for p in series), "patch_hash": patches.series_hash(series), "release": "b11549"},
    )()
    monkeypatch.delenv("DSPARK_STOCK_ARGMAX", raising=False)
    monkeypatch.delenv("DSPARK_STOCK_MMVF", raising=False)
    assert "turned off" not in patch_line(report)
    monkeypatch.setenv("DSPARK_STOCK_ARGMAX", "1")
    assert patch_line(report).endswith("; turned off by the environment: 0007 (DSPARK_STOCK_ARGMAX=1)")


def test_switched_off_sets_only_the_named_switches_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv("DSPARK_STOCK_MMVF", "keep")  # the user's own setting
    monkeypatch.delenv("DSPARK_NO_DEFER", raising=False)
    monkeypatch.delenv("DSPARK_STOCK_ARGMAX", raising=False)
    with patches.switched_off(("0005", "0007")):
        assert os.environ["DSPARK_NO_DEFER"] == "1" and os.environ["DSPARK_STOCK_ARGMAX"] == "1"
        assert "DSPARK_STOCK_MMVF" not in os.environ  # another set is not this block's
    assert os.environ["DSPARK_STOCK_MMVF"] == "keep"
    assert "DSPARK_NO_DEFER" not in os.environ and "DSPARK_STOCK_ARGMAX" not in os.environ
    with pytest.raises(KeyError, match="0001 has no off switch"):
        with patches.switched_off(("0001",)):
            pass
    assert os.environ["DSPARK_STOCK_MMVF"] == "keep"
