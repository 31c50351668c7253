"""llama.building: a second build of the same engine waits for the first (the lock), and the build's
progress lines are read as percentages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsparkcli.errors import EngineBuildError
from dsparkcli.llama import building

HOLD = """
import fcntl, os, sys, time
f = open(sys.argv[1], "a+"); fcntl.flock(f, fcntl.LOCK_EX); f.seek(0); f.truncate(); f.write(str(os.getpid())); f.flush()
print("held", flush=True); time.sleep(float(sys.argv[2]))
"""


def test_a_second_build_of_the_same_engine_waits_for_the_first(tmp_path: Path) -> None:
    root = tmp_path / "0c1e570-cpu-x86-64-v3-rpc-pabc"
    root.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root / ".build.lock"), "1.5"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    said: list[str] = []
    t0 = time.monotonic()
    with building.build_lock(root, lambda pct, line: said.append(line)):
        waited = time.monotonic() - t0
        assert (root / ".build.lock").read_text() == str(__import__("os").getpid())
    assert holder.wait(timeout=10) == 0
    assert waited >= 1.0, waited  # it did not build under the other one
    assert said == [f"waiting for another dspark engine build of {root.name} (pid {holder.pid})"]
    with building.build_lock(root, lambda pct, line: said.append(line)):  # free now: no wait, nothing said
        pass
    assert len(said) == 1


def test_steps_are_logged_with_their_progress_and_a_failure_is_one_line(tmp_path: Path) -> None:
    seen: list[tuple[float, str]] = []
    log = tmp_path / "build.log"
    building.run_steps(
        [["echo", "configured"], [sys.executable, "-c", "print('[1/4] a'); print('[ 50%] b')"]],
        log,
        lambda pct, line: seen.append((pct, line)),
    )
    assert seen == [(-1.0, "configured"), (25.0, "[1/4] a"), (50.0, "[ 50%] b")]
    assert log.read_text().splitlines()[0] == "$ echo configured"
    with pytest.raises(EngineBuildError) as e:
        building.run_steps([["true"], [sys.executable, "-c", "print('oops'); raise SystemExit(3)"]], log)
    assert e.value.message == "build failed (rc 3): oops" and str(log) in (e.value.hint or "")
    # the H200's failure: cmake's error line, then ninja's progress of other jobs, then the stop
    script = (
        "print('[258/376] Building a.o'); print('CMake Error: Not a file: /s/scripts/ui-assets.cmake'); "
        "print('[259/376] Building b.o'); print('ninja: build stopped: subcommand failed.'); raise SystemExit(1)"
    )
    with pytest.raises(EngineBuildError) as e:
        building.run_steps([["true"], [sys.executable, "-c", script]], log)
    assert e.value.message == "build failed (rc 1): CMake Error: Not a file: /s/scripts/ui-assets.cmake"


# ------------------------------------------------------------------ --backend cuda without cuBLAS (issue 40)


def _toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A toolkit of the compiler alone, laid out as this machine's: /usr/local/cuda-13.0 with nvcc, cudart and
    no cuBLAS, reached through a wrapper script elsewhere on PATH (its folder's parent is no toolkit), so only
    nvcc's own word (TOP=) finds it. Nothing of the host's CUDA is looked at."""
    root = tmp_path / "cuda-12.4"
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "lib64").mkdir()
    (root / "lib64" / "libcudart.so.12").write_bytes(b"")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "#$ TOP={root}/bin/.." >&2\n')
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    (wrappers / "nvcc").write_text(f'#!/bin/sh\nexec {nvcc} "$@"\n')
    for script in (nvcc, wrappers / "nvcc"):
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrappers}:/usr/bin:/bin")
    for name in ("CUDACXX", "CUDA_PATH", "CUDA_HOME", "CUDAToolkit_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(building, "SYSTEM_DIRS", (tmp_path / "usr",))
    monkeypatch.setattr(building, "DEFAULT_TOOLKIT", tmp_path / "no-default-toolkit")
    return root


def test_a_toolkit_without_cublas_is_named_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It configured, then stopped with a bare CMake line. The folders CMake searches are read instead."""
    root = _toolkit(tmp_path, monkeypatch)
    why = building.missing_cuda()
    assert why == (
        "--backend cuda needs cuBLAS, and this machine has no cublas_v2.h, libcublas or libcublasLt (looked in "
        f"{root}, {tmp_path}, {tmp_path / 'usr'}, where CMake looks); install the toolkit's cuBLAS (NVIDIA's CUDA "
        "repository: libcublas-dev-12-4), or put a toolkit that has it first (its bin/nvcc on PATH, or CUDACXX)"
    )
    (root / "include" / "cublas_v2.h").write_text("")
    (root / "lib64" / "libcublas.so.12").write_bytes(b"")
    assert "this machine has no libcublasLt (looked in" in (building.missing_cuda() or "")
    lt = tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / "libcublasLt.so"  # a distribution's place counts too
    lt.parent.mkdir(parents=True)
    lt.write_bytes(b"")
    assert building.missing_cuda() is None
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvcc anywhere CMake looks
    assert (building.missing_cuda() or "").startswith("--backend cuda needs nvcc, the CUDA compiler")


FAILING_TREE = """cmake_minimum_required(VERSION 3.16)
project(fake NONE)
add_custom_target(llama-server COMMAND ${CMAKE_COMMAND} -E echo "error: no cuBLAS" COMMAND ${CMAKE_COMMAND} -E false)
foreach(t llama-cli llama-quantize llama-gguf-split)
  add_custom_target(${t} COMMAND ${CMAKE_COMMAND} -E true)
endforeach()
file(WRITE ${CMAKE_BINARY_DIR}/weight.bin "configured")
"""


def test_a_cuda_build_is_refused_before_anything_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toolkit(tmp_path, monkeypatch)
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text(FAILING_TREE)
    with pytest.raises(EngineBuildError, match=r"^--backend cuda needs cuBLAS, and this machine has no cublas_v2.h"):
        building.build_engine(backend="cuda", source=tree, rpc=False)
    assert not any((tmp_path / "cache").rglob("CMakeCache.txt"))  # not configured, let alone built


def test_a_failed_build_removes_its_half_built_folder_and_keeps_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed build left its build folder (187 MB for CUDA) in the cache, reused by nothing."""
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text(FAILING_TREE)
    with pytest.raises(EngineBuildError) as e:
        building.build_engine(backend="cpu", source=tree, rpc=False, jobs=1)
    [log] = (tmp_path / "cache").rglob("build.log")
    assert e.value.message.startswith("build failed (rc ") and "error: no cuBLAS" in e.value.message
    assert e.value.hint is not None and e.value.hint.startswith(f"full log: {log}; the half-built folder (")
    assert e.value.hint.endswith(") was removed") and "folder (0 B)" not in e.value.hint  # it held the configure
    assert "error: no cuBLAS" in log.read_text()  # the log the line names is still there to read
    assert not (log.parent / "build").exists() and not (log.parent / "engine.json").exists()


# ------------------------------------------------------------------ a build off a terminal says it is alive (issue 40)

SLOW_TREE = """cmake_minimum_required(VERSION 3.16)
project(fake NONE)
add_custom_target(llama-server COMMAND ${CMAKE_COMMAND} -E sleep 1.5
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/bin
  COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_BINARY_DIR}/bin/llama-server)
foreach(t llama-cli llama-quantize llama-gguf-split)
  add_custom_target(${t} COMMAND ${CMAKE_COMMAND} -E true)
  add_dependencies(llama-server ${t})  # the quick steps first: ninja's [k/n] lines before the long one
endforeach()
"""


def test_a_build_off_a_terminal_says_when_it_starts_and_then_that_it_is_alive(
    cli, tmp_path: Path, monkeypatch
) -> None:
    """`make demo > log` showed nothing for 444 s, then "built in 444 s": the bar is off there, and nothing
    took its place. Now one line up front (the expected time, the log) and a line every HEARTBEAT_SECONDS."""
    from dsparkcli.cli import engine as engine_cli

    monkeypatch.setattr(engine_cli, "HEARTBEAT_SECONDS", 0.25)  # 30 s in use; the build here takes ~2 s
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text(SLOW_TREE)
    env = {"DSPARK_CACHE_DIR": str(tmp_path / "cache")}
    proc = cli("engine", "build", "--source", str(tree), "--no-rpc", "-j", "1", env=env)
    assert proc.returncode == 0, proc.stderr
    [log] = (tmp_path / "cache").rglob("build.log")
    lines = proc.stderr.splitlines()
    expected = building._CORE_SECONDS["cpu"] / 60
    assert (
        lines[0]
        == f"building llama.cpp (cpu) with 1 job: about {expected:.0f} min (a rough guess for 1 core); log: {log}"
    )
    beats = lines[1:]
    assert len(beats) >= 3 and all(
        re.fullmatch(r"still building llama.cpp \(cpu\) after \d+ s(: \d+ %)?", b) for b in beats
    )
    assert beats[-1].endswith(" %"), lines  # ninja's progress by the last one: the quick steps are done
    assert proc.stdout.startswith("built in ")
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    [(_, record)] = building.cached_builds()
    assert building.expected_seconds("cpu", 1) == (record.build_seconds, "the last cpu build here took that")
    cores = min(16, os.cpu_count() or 16)  # no CUDA build here: the rule of thumb, for the cores there are
    assert building.expected_seconds("cuda", 16) == (
        4800.0 / cores,
        f"a rough guess for {cores} core{'s' * (cores > 1)}",
    )
