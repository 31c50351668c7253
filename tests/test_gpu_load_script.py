"""study/gpu_load.sh, the H200 concurrency table's commands, run here on the CPU engine: the exact
`dspark bench --concurrency` the lead runs on the GPU (same flags, -ngl/-fa included), on small pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsparkcli.bench.records import from_record
from dsparkcli.synth import known_answer as synth
from dsparkcli.synth.full_width import write_full_width
from support.cli import REPO
from support.scripts import script


def _script(engine, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "DSPARK_LLAMA_BIN": str(engine.bin_dir),
        "DSPARK_STUDY_DIR": str(tmp / "study"),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(
        ["bash", "study/gpu_load.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    return proc, out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _table(md: Path) -> list[list[str]]:
    return [
        [c.strip() for c in ln.strip("|").split("|")]
        for ln in md.read_text().splitlines()
        if ln.startswith("| ") and not ln.startswith("| config")
    ]


def test_cpu_smoke_writes_the_table_and_its_records(engine, tmp_path):
    proc, out = _script(engine, tmp_path, "--cpu-smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _table(out / "load-smoke.md")
    assert [(r[0], r[1]) for r in rows] == [("plain", "1"), ("smoke@3", "1"), ("plain", "2"), ("smoke@3", "2")]
    assert all(r[-1] == "3/3" for r in rows if r[0] != "plain")  # outputs identical to plain at every level
    assert (out / "load-smoke.md").read_text().strip().splitlines()[-1].startswith("crossover: smoke@3: ")
    assert (out / "load-smoke.png").stat().st_size > 10_000
    for r in _records(out / "load-smoke.jsonl"):
        assert from_record(r).to_record() == {k: v for k, v in r.items() if k not in ("run_id", "provenance")}
    # the BENCHMARKS.md section, rebuilt from the raw records, shows the table the bench printed
    section = script("load_to_md").section(out / "load-smoke.jsonl")
    assert section.split("\n\n", 1)[1] == (out / "load-smoke.md").read_text()


@pytest.mark.parametrize("kind", ["real", "standin"])
def test_the_gpu_commands_run_as_written(engine, tmp_path, kind):
    """(a) --target/--draft and (b) --manifest (a scale-0.05 copy of the stand-in) with the GPU flags."""
    if kind == "real":
        pair = synth.write_pair(tmp_path / "pair", vocab=128, accept_rate=0.7, seed=5)
        args = ["--target", str(pair.target), "--draft", str(pair.draft)]
    else:
        fw = write_full_width(tmp_path / "fw", qtype="Q4_K", draft_qtype="Q8_0", target_arch="qwen35moe", scale=0.05)
        args = ["--manifest", str(fw.manifest)]
    proc, out = _script(engine, tmp_path, *args, "--levels", "1 2", "--reps", "1", "--limit", "1", "--n-predict", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(out / f"load-{kind}.jsonl")
    argv = next(r["server_argv"] for r in records if r["record"] == "request" and r["config"] != "plain")
    assert argv[argv.index("--spec-draft-n-max") + 1] == ("3" if kind == "real" else "5")
    assert argv[-6:] == ["-ngl", "99", "-ngld", "99", "-fa", "on"]
    summaries = [r for r in records if r["record"] == "load_summary"]
    assert [(s["config"], s["concurrency"]) for s in summaries] == [
        ("plain", 1),
        (f"{kind}@{argv[argv.index('--spec-draft-n-max') + 1]}", 1),
        ("plain", 2),
        (f"{kind}@{argv[argv.index('--spec-draft-n-max') + 1]}", 2),
    ]
    # both pairs are synthetic here: emulated acceptance on the stand-in, a scripted draft on the known-answer pair
    assert all(s["synthetic"] is True for s in summaries)
    head = (out / f"load-{kind}.md").read_text().splitlines()[0]
    assert ("--spec-synth-len 5.407" in head) is (kind == "standin") and "SYNTHETIC acceptance (" in head
