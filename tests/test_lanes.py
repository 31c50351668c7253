"""The test lanes (issue 29): markers declared and strict, tests/conftest.py marks each test from what it
uses, and the in-process `cli` gives what a `dspark` subprocess gives."""

from __future__ import annotations

import os
import subprocess
import sys

from support.cli import REPO, run_cli, run_cli_in_process

FAST = ("engine", "study", "torch", "timing")  # `make test-fast` deselects them all


def _lanes(*files: str) -> dict[str, set[str]]:
    """test id -> its lanes, as pytest collects them (one collection, through support.lane_dump)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "support.lane_dump",
            *files,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line[len("LANE ") :].rsplit(" ", 1) for line in proc.stdout.splitlines() if line.startswith("LANE ")]
    return {nodeid: set() if lanes == "-" else set(lanes.split(",")) for nodeid, lanes in rows}


def test_lanes_follow_what_a_test_uses():
    lanes = _lanes(
        "tests/test_engine.py",
        "tests/test_benchmarks_doc.py",
        "tests/test_requant.py",
        "tests/test_run.py",
        "tests/test_gguf_census.py",
        "tests/test_distill.py",
    )
    assert "engine" in lanes["tests/test_engine.py::test_second_build_call_reuses_the_cache"]  # the engine fixture
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
