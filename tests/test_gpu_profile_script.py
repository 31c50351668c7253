"""study/gpu_profile.sh, issue 19's H200 step profile, run here on the CPU engine: the smoke mode (server
timings only, exact counters of the known-answer pair) and the ncu path with a stand-in for ncu (a
wrapper that runs the real llama-server as its child and writes a CSV in ncu's layout when it exits)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dsparkcli.synth import known_answer as synth
from dsparkcli.synth.full_width import write_full_width
from support.cli import REPO

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # study/gpu_profile.py's prompt

# A stand-in for ncu: it runs the target command as its child (so the script must stop the SERVER for the
# report to be written, as with ncu), then writes two steps of three kernels in ncu's --csv layout.
FAKE_NCU = r"""#!/usr/bin/env bash
[ "$1" = --version ] && { echo "fake ncu (a test stand-in)"; exit 0; }
echo "$@" > "$(dirname "$0")/ncu-args.txt"
log=""
while [ $# -gt 0 ]; do
  case "$1" in --csv) shift ;; --log-file) log=$2; shift 2 ;; --*) shift 2 || exit 9 ;; *) break ;; esac
done
"$@" &
child=$!
wait "$child"
{
  echo '==PROF== Connected to process 1 (llama-server)'
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  i=0
  for step in 1 2; do
    for k in "void mul_mat_vec_q<(ggml_type)8, 1>(const void *)|2,000,000" "void rms_norm_f32<256>(const float *)|500000" "void k_get_rows_float<float, float>(const float *)|250000"; do
      echo "\"$i\",\"1\",\"llama-server\",\"127.0.0.1\",\"${k%%|*}\",\"1\",\"7\",\"(32, 1, 1)\",\"(4, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"nsecond\",\"${k##*|}\""
      i=$((i + 1))
    done
  done
} > "$log"
"""


def _run(engine, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
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
        ["bash", "study/gpu_profile.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    return proc, out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _table(md: Path) -> dict[str, list[str]]:
    rows = [
        [c.strip() for c in ln.strip("|").split("|")]
        for ln in md.read_text().splitlines()
        if ln.startswith("| ") and not ln.startswith("| config")
    ]
    return {r[0]: r for r in rows}


def test_cpu_smoke_records_the_servers_exact_counters(engine, tmp_path):
    proc, out = _run(engine, tmp_path, "--cpu-smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    man = synth.load_manifest(
        synth.write_pair(tmp_path / "pair", accept_rate=0.7, seed=5).manifest
    )  # the smoke's pair
    timing = {r["config"]: r for r in _records(out / "profile-smoke.jsonl") if r["record"] == "timing"}
    assert [r["config"] for r in _records(out / "profile-smoke.jsonl")] == [
        c for c in ("plain", "k1", "k3", "k7") for _ in range(2)
    ]  # 2 reps each
    assert timing["plain"]["steps"] == timing["plain"]["predicted_n"] == 32 and timing["plain"]["draft_n"] == 0
    for k in (1, 3, 7):
        pred = synth.predict(man, PROMPT, n_max=k, n_predict=32)
        r = timing[f"k{k}"]
        assert (r["steps"], r["draft_n"], r["draft_n_accepted"], r["predicted_n"]) == (
            pred.steps,
            pred.draft_n,
            pred.draft_n_accepted,
            32,
        )
        assert r["tokens_per_step"] == 32 / pred.steps and r["t_step_ms"] == r["predicted_ms"] / pred.steps
        assert r["server_argv"][r["server_argv"].index("--spec-draft-n-max") + 1] == str(k)
        assert r["synthetic"] is False
        assert r["draft_calls"] == pred.steps and r["t_draft_ms"] > 0  # from the -lv 4 statistics line
    rows = _table(out / "profile-smoke.md")
    assert list(rows) == ["plain", "k1", "k3", "k7"]
    assert rows["k3"][4] == "–"  # no kernel profile
    med = sorted(r["t_step_ms"] for r in _records(out / "profile-smoke.jsonl") if r["config"] == "k3")[0]
    assert rows["k3"][1] == f"{med:.3f}"  # the lower of 2 reps is the median request


def test_no_plain_profiles_the_budgets_only(engine, tmp_path):
    """--no-plain: a later call adds budgets to a label without plain decoding's servers again."""
    proc, out = _run(engine, tmp_path, "--cpu-smoke", "--no-plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["config"] for r in _records(out / "profile-smoke.jsonl")] == [
        c for c in ("k1", "k3", "k7") for _ in range(2)
    ]
    assert list(_table(out / "profile-smoke.md")) == ["k1", "k3", "k7"]


def test_the_ncu_path_as_written(engine, tmp_path):
    """The GPU command's flags (-ngl 99 -ngld 99 -fa on, --synth-len), the ncu window, the server stopped under
    the profiler and its CSV turned into kernel records and the table's kernel columns."""
    pair = synth.write_pair(tmp_path / "pair", accept_rate=0.7, seed=5)
    ncu = tmp_path / "bin" / "ncu"
    ncu.parent.mkdir()
    ncu.write_text(FAKE_NCU)
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    proc, out = _run(
        engine,
        tmp_path,
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--budgets",
        "1 3",
        "--synth-len",
        "2.5",
        "--reps",
        "1",
        "--n-predict",
        "16",
        "--ncu-n-predict",
        "8",
        "--skip",
        "5",
        "--count",
        "9",
        "--ncu",
        str(ncu),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = (ncu.parent / "ncu-args.txt").read_text().split()
    assert args[: args.index("--log-file")] == [
        "--target-processes",
        "all",
        "--metrics",
        "gpu__time_duration.sum",
        "--csv",
        "--print-units",
        "base",
        "--cache-control",
        "none",
        "--clock-control",
        "none",
        "--launch-skip",
        "5",
        "--launch-count",
        "9",
    ]
    records = _records(out / "profile-real.jsonl")
    assert [(r["record"], r["config"]) for r in records] == [
        ("timing", "plain"),
        ("kernels", "plain"),
        ("timing", "k1"),
        ("kernels", "k1"),
        ("timing", "k3"),
        ("kernels", "k3"),
    ]
    timing = {r["config"]: r for r in records if r["record"] == "timing"}
    assert timing["k3"]["server_argv"][-6:] == ["-ngl", "99", "-ngld", "99", "-fa", "on"]
    for k, length in (("k1", "2.0"), ("k3", "2.5")):  # at most k+1: llama.cpp refuses more
        argv = timing[k]["server_argv"]
        assert argv[argv.index("--spec-synth-len") + 1] == length and timing[k]["synthetic"] is True
    assert "--spec-synth-len" not in timing["plain"]["server_argv"] and timing["plain"]["synthetic"] is False
    assert timing["k3"]["t_draft_ms"] > 0 and timing["k3"]["draft_calls"] == timing["k3"]["steps"]
    kern = next(r for r in records if r["record"] == "kernels" and r["config"] == "k3")
    assert (len(kern["kernels"]), kern["period"], kern["steps_in_window"]) == (6, 3, 2.0)
    assert kern["kinds"] == ["matmul", "norm", "copy"] and [k[2] for k in kern["kernels"][:3]] == [2e6, 5e5, 2.5e5]
    # ncu's raw CSVs come back as one archive (the device returns at most 8 files)
    assert (
        "ncu-k3.csv"
        in subprocess.run(["tar", "tzf", str(out / "ncu-csv.tar.gz")], capture_output=True, text=True).stdout
    )
    md = (out / "profile-real.md").read_text()
    assert "SYNTHETIC acceptance (--spec-synth-len 2, 2.5)" in md.splitlines()[0]
    row = _table(out / "profile-real.md")["k3"]
    # kernels ms, then by kind: matmul, moe, flash attn, norm, rope, elementwise, copy, sampling, recurrent, other
    assert row[3] == f"{timing['k3']['t_draft_ms']:.3f}"
    assert row[4:15] == [
        "2.750",
        "2.000",
        "0.000",
        "0.000",
        "0.500",
        "0.000",
        "0.000",
        "0.250",
        "0.000",
        "0.000",
        "0.000",
    ]
    assert row[15] == f"{timing['k3']['t_step_ms'] - 2.75:.3f}" and row[16] == "3"  # the gap; kernels per step
    # no server outlives the run (the fake ncu's child included)
    assert subprocess.run(["pgrep", "-f", str(pair.target)], capture_output=True).returncode == 1


def test_the_stand_in_command_as_written(engine, tmp_path):
    """The default GPU command's pair path (--manifest: a scale-0.05 copy of the full-width stand-in), L = 1."""
    fw = write_full_width(tmp_path / "fw", qtype="Q4_K", draft_qtype="Q8_0", target_arch="qwen35moe", scale=0.05)
    ncu = tmp_path / "bin" / "ncu"
    ncu.parent.mkdir()
    ncu.write_text(FAKE_NCU)
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    proc, out = _run(
        engine,
        tmp_path,
        "--manifest",
        str(fw.manifest),
        "--budgets",
        "1",
        "--reps",
        "1",
        "--n-predict",
        "8",
        "--ncu-n-predict",
        "4",
        "--ncu",
        str(ncu),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    timing = {r["config"]: r for r in _records(out / "profile-standin.jsonl") if r["record"] == "timing"}
    argv = timing["k1"]["server_argv"]
    assert argv[argv.index("--spec-synth-len") + 1] == "1.0"  # every draft rejected: the step-cost cells
    # L = 1 at k = 1: every step drafts 1, accepts 0 and yields 1 token; of the 8 tokens the first comes from the
    # prompt and the last is decoded plainly (no room left to draft), so 6 steps
    k1 = timing["k1"]
    assert (k1["predicted_n"], k1["steps"], k1["draft_n"], k1["draft_n_accepted"]) == (8, 6, 6, 0)
    assert "SYNTHETIC acceptance (--spec-synth-len 1)" in (out / "profile-standin.md").read_text()


@pytest.mark.parametrize("bad", [["--budgets"], ["--frobnicate", "1"]])
def test_usage_errors(engine, tmp_path, bad):
    proc, _ = _run(engine, tmp_path, *bad)
    assert proc.returncode != 0
