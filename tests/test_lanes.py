"""The test lanes (issue 29): markers declared and strict, tests/conftest.py marks each test from what it
uses, and the in-process `cli` gives what a `dspark` subprocess gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.cli import REPO, run_cli, run_cli_in_process

FAST = ("engine", "study", "torch", "timing")  # `make test-fast` deselects them all


def _collect(*args: str, env: dict[str, str | None] | None = None) -> str:
    """``pytest --collect-only ARGS`` through support.lane_dump: its LANE and ENGINE lines (``env``: None unsets)."""
    full = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "support.lane_dump"]
        + list(args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in full.items() if v is not None},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _lanes(*files: str) -> dict[str, set[str]]:
    """test id -> its lanes, as pytest collects them (one collection, through support.lane_dump)."""
    out = _collect(*files)
    rows = [line[len("LANE ") :].rsplit(" ", 1) for line in out.splitlines() if line.startswith("LANE ")]
    return {nodeid: set() if lanes == "-" else set(lanes.split(",")) for nodeid, lanes in rows}


def test_lanes_follow_what_a_test_uses():
    lanes = _lanes(
        "tests/test_engine.py",
        "tests/test_benchmarks_doc.py",
        "tests/test_requant.py",
        "tests/test_run.py",
        "tests/test_gguf_census.py",
        "tests/test_distill.py",
        "tests/test_patches.py",
    )
    assert "engine" in lanes["tests/test_engine.py::test_second_build_call_reuses_the_cache"]  # the engine fixture
    # the pinned llama.cpp tree (through test_patches.pinned_tree): `make engine` downloads it, a newcomer lacks it
    assert lanes["tests/test_patches.py::test_the_shipped_series_applies_to_the_pinned_tree_in_order"] == {"engine"}
    assert lanes["tests/test_patches.py::test_apply_is_strict_finds_moved_code_and_creates_files"] == set()
    assert lanes["tests/test_engine.py::test_parse_version_line"] == set()  # the fast lane
    assert "study" in lanes["tests/test_benchmarks_doc.py::test_generated_section_is_the_records_rendered"]  # script()
    assert "study" in lanes["tests/test_requant.py::test_standalone_type_map_script"]  # "study.gguf_tensor_type_map"
    # study.overhead through script() (its docstring's study/run_overhead.py alone would not count); engine from
    # the fixture, timing by hand
    assert lanes["tests/test_run.py::test_dspark_adds_no_measurable_overhead"] == {"engine", "study", "timing"}
    assert lanes["tests/test_gguf_census.py::test_census_of_a_20_gb_sparse_file_under_one_second"] == {"timing"}
    distill = {k: v for k, v in lanes.items() if k.startswith("tests/test_distill.py::")}
    assert len(distill) > 20 and all("torch" in v for v in distill.values())  # the module imports torch


def test_an_undeclared_marker_is_a_collection_error(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.enigne\ndef test_x():\n    pass\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "'enigne' not found in `markers` configuration option" in proc.stdout


def test_in_process_cli_gives_what_the_subprocess_gives(tmp_path):
    missing = str(tmp_path / "absent.gguf")
    for args in (
        ["inspect", missing],
        ["--version"],
        ["bench", "--reps", "0"],
        ["inspect", missing, "--", "-ngl", "9"],
        ["synth-predict", "--help"],
    ):
        inside, child = run_cli_in_process(*args), run_cli(*args)
        assert (inside.returncode, inside.stdout, inside.stderr) == (child.returncode, child.stdout, child.stderr), (
            args
        )
    # a `--` of one call is not carried into the next (cli._common.PASSTHROUGH is module state)
    assert run_cli_in_process("inspect", missing).stderr == run_cli("inspect", missing).stderr
    # an environment read at import (COLUMNS: the consoles' width; HF_*: huggingface_hub's constants) sends
    # the call to a subprocess; dspark's own settings are read per call and stay in this process
    assert run_cli_in_process("--version", env={"COLUMNS": "200"}).args[0] == sys.executable
    assert run_cli_in_process("--version", env={"HF_HUB_OFFLINE": "1"}).args[0] == sys.executable
    assert run_cli_in_process("--version", env={"DSPARK_CONFIG_DIR": str(tmp_path)}).args[0] == "dspark"
    # HF_ENDPOINT is dspark's own per-call reading (hub.cache.hf_endpoint): in this process, the same answer
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: nobody listens
    inside, child = (
        run_cli_in_process("inspect", "hf://o/r/x.gguf", env=dead),
        run_cli("inspect", "hf://o/r/x.gguf", env=dead),
    )
    assert inside.args[0] == "dspark" and inside.returncode == child.returncode == 5
    assert inside.stderr == child.stderr and "cannot reach http://127.0.0.1:9" in inside.stderr


def test_a_run_without_the_engine_lane_finds_no_engine(tmp_path):
    """`make test-fast` runs as a newcomer's machine before `make engine`, whatever engine this one has: so a
    test that needs the engine without its mark fails in the fast lane instead of passing here."""
    bin_dir = tmp_path / "cache" / "engine" / "0c1e570-cpu" / "build" / "bin"  # a cached build, as `make engine`
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    (bin_dir / "llama-server").chmod(0o755)
    record = {"commit": "0c1e570", "backend": "cpu", "cuda_arch": "", "source_dir": "", "bin_dir": str(bin_dir)}
    (bin_dir.parent.parent / "engine.json").write_text(json.dumps(record))
    (tmp_path / "cfg").mkdir()
    config_file = tmp_path / "cfg" / "config.toml"
    env: dict[str, str | None] = {
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
        "DSPARK_LLAMA_BIN": None,
    }
    probe = "tests/test_lanes.py::test_an_undeclared_marker_is_a_collection_error"  # a quick collection
    assert "ENGINE cache" in _collect(probe, env=env).splitlines()
    # the same build named twice more, by the config file and by DSPARK_LLAMA_BIN: the fast lane finds none
    config_file.write_text(f'[engine]\nllama_bin = "{bin_dir}"\n')
    env["DSPARK_LLAMA_BIN"] = str(bin_dir)
    assert "ENGINE none" in _collect(probe, "-m", FAST_LANE, env=env).splitlines()


FAST_LANE = " and ".join(f"not {lane}" for lane in FAST)


def test_the_makefiles_fast_lane_is_this_one():
    """`make test-fast` deselects exactly the lanes FAST names (the lane test above checks this expression)."""
    assert f"FAST := {FAST_LANE}\n" in (REPO / "Makefile").read_text(encoding="utf-8")
