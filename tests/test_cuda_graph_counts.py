"""Patch 0008 (CUDA graph counters) on the CPU: its counting struct, cut out of the patched ggml-cuda/common.cuh
and compiled here, counts a scripted life of a cached graph exactly (what the H200 counters mean rests on it),
and the line the engine logs is the one study/step_switches.py --graph-stats reads."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dsparkcli.llama import patches, sources
from support.scripts import script

HARNESS = Path(__file__).resolve().parent / "support" / "cuda_graph_counts" / "harness.cpp"
CUDA = Path("ggml/src/ggml-cuda")
REPO = Path(__file__).resolve().parent.parent


# every base dspark has a series for: the rebased 0008 must count the same
BASES = [pytest.param(s, id=s.release) for s in sources.SDISTS]


def _patched(tmp_path: Path, sdist: sources.SdistSource) -> Path:
    source = sources.sdist_tree(sdist)
    tree = tmp_path / "tree"
    (tree / CUDA).mkdir(parents=True)
    for name in ("ggml-cuda.cu", "common.cuh"):
        shutil.copy(source / CUDA / name, tree / CUDA / name)
    series = patches.series_for(sdist.release)
    assert series, sdist.release
    patches.apply(tree, next(p for p in series if p.number == "0008"))
    return tree


@pytest.mark.parametrize("sdist", BASES)
def test_the_counts_of_a_scripted_graph_life_are_exact(tmp_path: Path, sdist: sources.SdistSource) -> None:
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (the engine build needs it too)")
    text = (_patched(tmp_path, sdist) / CUDA / "common.cuh").read_text()
    start = text.index("struct ggml_cuda_graph_counts {")
    (tmp_path / "COUNTS.inc").write_text(text[start : text.index("// dspark: end of ggml_cuda_graph_counts", start)])
    shutil.copy(HARNESS, tmp_path / "harness.cpp")
    subprocess.run(
        ["g++", "-std=c++17", "-O1", str(tmp_path / "harness.cpp"), "-o", str(tmp_path / "h")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = subprocess.run([str(tmp_path / "h")], check=True, capture_output=True, text=True, timeout=30).stdout
    # 128 rounds of 7 computes: 5 use a graph (2 of them captured), 2 run directly, 1 of those after a reset
    assert out.strip() == "computes 896 launched 384 captured 256 resets 128 direct 256 lines 3"


@pytest.mark.parametrize("sdist", BASES)
def test_the_logged_line_is_the_one_step_switches_reads(tmp_path: Path, sdist: sources.SdistSource) -> None:
    cu = (_patched(tmp_path, sdist) / CUDA / "ggml-cuda.cu").read_text()
    fmt = re.search(r'GGML_LOG_WARN\("(dspark-cuda-graphs:[^"]+)\\n"', cu).group(1)
    line = fmt.replace("%p", "{}").replace("%llu", "{}").replace("%zu", "{}")
    log = tmp_path / "llama-server-1-x.log"
    log.write_text(
        "\n".join(
            [
                line.format("0xa", 256, 1, 2, 3, 253, 4),
                "noise",
                line.format("0xb", 256, 200, 6, 0, 50, 2),
                line.format("0xa", 512, 240, 8, 5, 264, 6),
            ]
        )
    )
    step_switches = script("step_switches")

    assert step_switches.graph_counters([log]) == [
        {
            "log": log.name,
            "ctx": 0,
            "computes": 512,
            "launched": 240,
            "captured": 8,
            "resets": 5,
            "direct": 264,
            "graphs": 6,
        },
        {
            "log": log.name,
            "ctx": 1,
            "computes": 256,
            "launched": 200,
            "captured": 6,
            "resets": 0,
            "direct": 50,
            "graphs": 2,
        },
    ]
