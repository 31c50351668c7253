"""Patch 0008 (CUDA: one cached graph per shape) on the CPU: its key function, cut out of the patched
ggml-cuda.cu and compiled against ggml's own headers and libggml-base, gives graphs of different shapes
built into the same memory (as llama.cpp builds a speculative step's graphs) different keys, the same shape
the same key; with DSPARK_STOCK_GRAPH_KEY=1 every shape gets the first node's address, the stock key they
all collided on. The GPU run that measures it: BENCHMARKS.md, "CUDA graphs in the speculative step"."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import patches

HARNESS = Path(__file__).resolve().parent / "support" / "cuda_graph_key" / "harness.cpp"
CUDA = Path("ggml/src/ggml-cuda")


def _key_function(patched_cu: str) -> str:
    start = patched_cu.index("static const void * ggml_cuda_graph_get_key(ggml_cgraph * cgraph) {")
    return patched_cu[start : patched_cu.index("\n}\n", start) + 3]


@pytest.fixture(scope="module")
def harness(engine, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (the engine build needs it too)")
    source = engine_mod.vendored_source()
    tree = tmp_path_factory.mktemp("cuda-tree")
    (tree / CUDA).mkdir(parents=True)
    for name in ("ggml-cuda.cu", "common.cuh"):
        shutil.copy(source / CUDA / name, tree / CUDA / name)
    patch = next(p for p in patches.shipped() if p.number == "0008")
    patches.apply(tree, patch)
    work = tree / "harness"
    work.mkdir()
    (work / "KEY_FUNCTION.inc").write_text(_key_function((tree / CUDA / "ggml-cuda.cu").read_text()))
    shutil.copy(HARNESS, work / "harness.cpp")
    lib_dir = engine.bin_dir
    assert (lib_dir / "libggml-base.so").exists(), "the CPU engine is built with shared ggml libraries"
    exe = work / "harness"
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", str(source / "ggml/include"), "-I", str(source / "ggml/src"),
                    str(work / "harness.cpp"), "-L", str(lib_dir), "-lggml-base", f"-Wl,-rpath,{lib_dir}",
                    "-o", str(exe)], check=True, capture_output=True, text=True, timeout=300)
    return exe


def _run(exe: Path, **env: str) -> tuple[list[tuple[int, str, str]], str]:
    environ = {k: v for k, v in os.environ.items() if k != "DSPARK_STOCK_GRAPH_KEY"} | env
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60, env=environ).stdout
    rows = [(int(n), first, key) for n, first, key in re.findall(r"n_tokens (\d+) first_node (\S+) key (\S+)", out)]
    return rows, out


@pytest.mark.engine
def test_each_shape_gets_its_own_graph_and_the_same_shape_the_same(harness: Path) -> None:
    rows, out = _run(harness)
    assert [n for n, _, _ in rows] == [1, 4, 1]
    firsts = {first for _, first, _ in rows}
    assert len(firsts) == 1  # the three graphs were built into the same memory: one first node
    keys = [key for _, _, key in rows]
    assert keys[0] == keys[2] != keys[1] and keys[0] not in firsts
    assert "same_shape_same_key 1 other_shape_other_key 1" in out


@pytest.mark.engine
def test_the_off_switch_restores_the_stock_key_that_every_shape_shared(harness: Path) -> None:
    rows, out = _run(harness, DSPARK_STOCK_GRAPH_KEY="1")
    assert {key for _, _, key in rows} == {first for _, first, _ in rows} and len(rows) == 3
    assert "other_shape_other_key 0" in out
