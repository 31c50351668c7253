"""The kit's GPU measurements as lease plans (study/plans/*.toml, run by study/lease.py; they were shell
scripts): every plan well formed, and the load and profile plans dry-run on the CPU engine with the legs'
commands as written (the GPU's flags aside), their records checked as the scripts' smoke tests checked them.
The tune and adaptive plans' dry runs are in tests/test_tune.py and tests/test_adaptive.py."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dsparkcli.bench.records import from_record
from dsparkcli.synth import known_answer as synth
from support.cli import REPO
from support.plans import PLANS, device_dir, dry_run_plan
from support.scripts import script

lease = script("lease")
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


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rows(md: Path) -> list[list[str]]:
    return [
        [c.strip() for c in ln.strip("|").split("|")]
        for ln in md.read_text().splitlines()
        if ln.startswith("| ") and not ln.startswith("| config")
    ]


def test_every_plan_is_well_formed_and_fits_a_call():
    plans = sorted(PLANS.glob("*.toml"))
    names = {p.stem for p in plans}
    assert {"sweep", "load", "profile", "rpc", "distill", "graphs", "tune", "adaptive"} <= names
    ids = set()
    for path in plans:
        plan = lease.read_plan(path)
        ids.add(plan.id)
        assert [leg.rank for leg in plan.legs] == sorted({leg.rank for leg in plan.legs}), path
        for leg in plan.legs:
            assert leg.expected_s > 0 and "engine" in leg.needs and "$LEG_OUT" in leg.command, (path, leg.name)
            assert leg.expected_s <= 540, (path, leg.name)  # one device call, with room for the poll's start
        # every variable a leg reads is one the lease sets (a typo would be an empty size on the GPU)
        known = set(plan.leg_vars("gpu")) | {"T", "D", "N", "LIMIT", "REPS", "ROUNDS", "SB", "MT", "SBLIMIT"}
        known |= {
            "SBTUNE",
            "PNG",
            "T47",
            "M47",
            "D47",
            "TM",
            "DM",
            "MM",
            "PROFILE",
            "WORK",
            "PY",
            "LEG_OUT",
            "GPU",
            "PWD",
        }
        for leg in plan.legs:
            used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", leg.command))
            used -= set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", leg.command))  # the leg's own
            assert used <= known, (path, leg.name, used - known)
    assert len(ids) == len(plans)  # a plan's legs are "done" per plan id: two plans must not share one
    assert lease.read_plan(lease.PLAN).id not in ids


def test_start_begins_only_the_stand_ins_a_plan_needs():
    assert lease.read_plan(lease.PLAN).jobs() == ["engine", "standin"]  # the lease in flight, as before
    assert lease.read_plan(PLANS / "load.toml").jobs() == ["engine", "standin-moe"]
    assert lease.read_plan(PLANS / "tune.toml").jobs() == ["engine"]
    sizes = lease.read_plan(PLANS / "load.toml")
    assert sizes.leg_vars("gpu")["LEVELS"] == "1 2 4 8 16" and sizes.leg_vars("dry")["LEVELS"] == "1 2"


def test_a_plan_with_an_unknown_need_or_a_bad_variable_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('plan = "x"\n[[legs]]\nname = "a"\nrank = 1\nexpected_s = 1\nneeds = ["gpu"]\ncommand = "true"\n')
    with pytest.raises(SystemExit, match="needs \\['gpu'\\]"):
        lease.read_plan(bad)
    bad.write_text(
        'plan = "x"\n[vars]\nlevels = "1"\n[[legs]]\nname = "a"\nrank = 1\nexpected_s = 1\ncommand = "true"\n'
    )
    with pytest.raises(SystemExit, match="vars.levels"):
        lease.read_plan(bad)


def test_an_archive_over_what_a_returned_file_holds_comes_back_in_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "BACK_PART", 1000)
    big = tmp_path / "out" / "lease-3.tar.gz"
    big.parent.mkdir()
    data = bytes(range(256)) * 10
    big.write_bytes(data)
    parts = lease.split_back(big)
    assert [p.name for p in parts] == [f"lease-3.tar.gz.part0{i}" for i in range(3)] and not big.exists()
    other = tmp_path / "out" / "lease-2.tar.gz"
    other.write_bytes(b"x")
    joined = lease.join_back([other, *reversed(parts)], tmp_path / "joined")
    assert [p.name for p in joined] == ["lease-2.tar.gz", "lease-3.tar.gz"]  # the order given, parts joined
    assert joined[0] == other and joined[1].read_bytes() == data


@pytest.mark.engine
def test_the_load_plan_writes_the_tables_and_their_records(engine, tmp_path, monkeypatch):
    """The former study/gpu_load.sh: the REAL leg (here the known-answer pair) and the stand-in leg (a 5 %
    copy of the qwen35moe full-width pair), two levels, a few short requests."""
    dest = dry_run_plan("load", engine, tmp_path, monkeypatch)
    out = dest / "load-real"
    rows = _rows(out / "load-real.md")
    assert [(r[0], r[1]) for r in rows] == [("plain", "1"), ("real@3", "1"), ("plain", "2"), ("real@3", "2")]
    assert all(r[-1] == "3/3" for r in rows if r[0] != "plain")  # outputs identical to plain at every level
    assert (out / "load-real.md").read_text().strip().splitlines()[-1].startswith("crossover: real@3: ")
    assert (out / "load-real.png").stat().st_size > 10_000
    for r in _records(out / "load-real.jsonl"):
        assert from_record(r).to_record() == {k: v for k, v in r.items() if k not in ("run_id", "provenance")}
    # the BENCHMARKS.md section, rebuilt from the raw records, shows the table the bench printed
    section = script("load_to_md").section(out / "load-real.jsonl")
    assert section.split("\n\n", 1)[1] == (out / "load-real.md").read_text()
    for kind, budget in (("real", "3"), ("standin", "5")):
        records = _records(dest / f"load-{kind}" / f"load-{kind}.jsonl")
        argv = next(r["server_argv"] for r in records if r["record"] == "request" and r["config"] != "plain")
        assert argv[argv.index("--spec-draft-n-max") + 1] == budget
        assert argv[-2:] == ["-t", "1"]  # the leg's server flags ("${GPU[@]}": -ngl 99 -ngld 99 -fa on there)
        summaries = [r for r in records if r["record"] == "load_summary"]
        assert [(s["config"], s["concurrency"]) for s in summaries] == [
            ("plain", 1),
            (f"{kind}@{budget}", 1),
            ("plain", 2),
            (f"{kind}@{budget}", 2),
        ]
        # both pairs are synthetic here: emulated acceptance on the stand-in, a scripted draft on the known-answer pair
        assert all(s["synthetic"] is True for s in summaries)
        head = (dest / f"load-{kind}" / f"load-{kind}.md").read_text().splitlines()[0]
        assert ("--spec-synth-len 5.407" in head) is (kind == "standin") and "SYNTHETIC acceptance (" in head


@pytest.mark.engine
def test_the_profile_plan_records_the_servers_exact_counters(engine, tmp_path, monkeypatch):
    """The former study/gpu_profile.sh: server timings only in the dry run (no ncu); the REAL leg's pair is
    the known-answer one, so every counter is predicted exactly; the stand-in leg runs at L = 1."""
    dest = dry_run_plan("profile", engine, tmp_path, monkeypatch)
    man = synth.load_manifest(device_dir(tmp_path) / "pair" / "manifest.json")
    records = _records(dest / "profile-real" / "profile-real.jsonl")
    assert [r["config"] for r in records] == [c for c in ("plain", "k1", "k3", "k7") for _ in range(2)]  # 2 reps
    timing = {r["config"]: r for r in records if r["record"] == "timing"}
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
    rows = {r[0]: r for r in _rows(dest / "profile-real" / "profile-real.md")}
    assert list(rows) == ["plain", "k1", "k3", "k7"]
    assert rows["k3"][4] == "–"  # no kernel profile
    med = sorted(r["t_step_ms"] for r in records if r["config"] == "k3")[0]
    assert rows["k3"][1] == f"{med:.3f}"  # the lower of 2 reps is the median request
    timing = {r["config"]: r for r in _records(dest / "profile-standin" / "profile-standin.jsonl")}
    argv = timing["k1"]["server_argv"]
    assert argv[argv.index("--spec-synth-len") + 1] == "1.0"  # every draft rejected: the step-cost cells
    # L = 1 at k = 1: every step drafts 1, accepts 0 and yields 1 token; of the 32 tokens the first comes from
    # the prompt and the last is decoded plainly (no room left to draft), so 30 steps
    k1 = timing["k1"]
    assert (k1["predicted_n"], k1["steps"], k1["draft_n"], k1["draft_n_accepted"]) == (32, 30, 30, 0)
    assert "SYNTHETIC acceptance (--spec-synth-len 1)" in (dest / "profile-standin" / "profile-standin.md").read_text()


@pytest.mark.engine
def test_the_profiles_ncu_path(engine, tmp_path):
    """study/gpu_profile.py as the profile plan's GPU legs run it, with a stand-in for ncu: the ncu window, the
    server stopped under the profiler and its CSV turned into kernel records and the table's kernel columns."""
    pair = synth.write_pair(tmp_path / "pair", accept_rate=0.7, seed=5)
    ncu = tmp_path / "bin" / "ncu"
    ncu.parent.mkdir()
    ncu.write_text(FAKE_NCU)
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out" / "profile-real.jsonl"
    env = {"DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp_path / "cache")}
    env |= {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    args = ["--target", str(pair.target), "--draft", str(pair.draft), "--budgets", "1", "3", "--synth-len", "2.5"]
    args += ["--reps", "1", "--n-predict", "16", "--ncu-n-predict", "8", "--skip", "5", "--count", "9"]
    args += ["--ncu", str(ncu), "--out", str(out), "--csv-dir", str(tmp_path / "csv"), "--threads", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "study.gpu_profile", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ncu_args = (ncu.parent / "ncu-args.txt").read_text().split()
    assert ncu_args[: ncu_args.index("--log-file")] == [
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
    records = _records(out)
    assert [(r["record"], r["config"]) for r in records] == [
        ("timing", "plain"),
        ("kernels", "plain"),
        ("timing", "k1"),
        ("kernels", "k1"),
        ("timing", "k3"),
        ("kernels", "k3"),
    ]
    timing = {r["config"]: r for r in records if r["record"] == "timing"}
    for k, length in (("k1", "2.0"), ("k3", "2.5")):  # at most k+1: llama.cpp refuses more
        argv = timing[k]["server_argv"]
        assert argv[argv.index("--spec-synth-len") + 1] == length and timing[k]["synthetic"] is True
    assert "--spec-synth-len" not in timing["plain"]["server_argv"] and timing["plain"]["synthetic"] is False
    assert timing["k3"]["t_draft_ms"] > 0 and timing["k3"]["draft_calls"] == timing["k3"]["steps"]
    kern = next(r for r in records if r["record"] == "kernels" and r["config"] == "k3")
    assert (len(kern["kernels"]), kern["period"], kern["steps_in_window"]) == (6, 3, 2.0)
    assert kern["kinds"] == ["matmul", "norm", "copy"] and [k[2] for k in kern["kernels"][:3]] == [2e6, 5e5, 2.5e5]
    assert (tmp_path / "csv" / "ncu-k3.csv").is_file()  # the raw CSVs, which the leg archives
    table = subprocess.run(
        [sys.executable, "-m", "study.profile_to_md", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    ).stdout
    assert "SYNTHETIC acceptance (--spec-synth-len 2, 2.5)" in table.splitlines()[0]
    row = next(r for r in (ln.strip("|").split("|") for ln in table.splitlines() if ln.startswith("| k3 ")))
    row = [c.strip() for c in row]
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


@pytest.mark.engine
def test_the_rpc_plan_finds_direct_and_worker_alike(engine, tmp_path, monkeypatch):
    """The former study/gpu_rpc.sh: every pair served directly and through a local worker gives the same
    tokens and counts (the known-answer pair: the exact prediction too)."""
    dest = dry_run_plan("rpc", engine, tmp_path, monkeypatch)
    for leg in ("rpc-known-answer", "rpc-standin", "rpc-real"):
        (summary,) = [r for r in _records(dest / leg / "rpc_check.jsonl") if r["record"] == "summary"]
        assert summary["tokens_equal"] is True and summary["counts_equal"] is True, leg
        assert summary["predicted"] is (True if leg == "rpc-known-answer" else None)


@pytest.mark.engine
def test_the_distill_plan_trains_a_draft_and_benches_it(engine, tmp_path, monkeypatch):
    """The former study/gpu_distill.sh: `dspark distill` on the lease's target, the draft back in the leg's
    folder (its sha256 the report's), then benched beside the shipped draft and plain decoding."""
    dest = dry_run_plan("distill", engine, tmp_path, monkeypatch)
    report = json.loads((dest / "distill-train" / "distill-report.json").read_text())
    draft = dest / "distill-train" / "draft.gguf"
    assert lease.sha256_of(draft) == report["out_sha256"] and draft.stat().st_size == report["out_bytes"]
    summary = json.loads((dest / "distill-bench" / "bench-summary.json").read_text())["summaries"]
    assert {s["config"] for s in summary} == {"plain", "distilled@1", "distilled@3", "shipped@1", "shipped@3"}


@pytest.mark.engine
def test_the_graphs_plan_measures_every_switch_set(engine, tmp_path, monkeypatch):
    """The former study/gpu_graphs.sh: patches 0006/0007 on, off and CUDA graphs off, on the REAL pair and the
    stand-in, and the kit's budgets against plain."""
    dest = dry_run_plan("graphs", engine, tmp_path, monkeypatch)
    for leg in ("switches-real", "switches-standin"):
        doc = json.loads((dest / leg / "step-switches.json").read_text())
        assert set(doc["switch_sets"]) == {"patched", "stock", "no graphs"}
        cost = {(r["config"], r["switches"]) for r in doc["rows"] if r["table"] == "cost"}
        assert {s for _, s in cost} == {"patched", "stock", "no graphs"} and ("plain", "stock") in cost
        assert (dest / leg / "graph-stats.json").is_file()
    rows = _rows(dest / "kit-real" / "bench.md")
    assert {r[0] for r in rows} >= {"plain", "smollm2-135m-dspark@1", "smollm2-135m-dspark@3"}


@pytest.mark.engine
def test_the_sweep_plan_splits_the_grid_and_tunes_against_it(engine, tmp_path, monkeypatch):
    """The former study/gpu_study.sh: doctor's selftest, the kit on the stand-in, the sweep's two halves (no
    configuration measured twice: the second resumes from the machine's history) and tune vs the grid."""
    dest = dry_run_plan("sweep", engine, tmp_path, monkeypatch)
    assert "selftest PASS" in (dest / "doctor-hbm" / "selftest.txt").read_text()
    kit = script("lease_render").summaries(dest / "kit-standin" / "bench-kit.jsonl")
    assert {r["budget"] for r in kit} == {None, 5, 15} and all(r["synthetic"] for r in kit if r["budget"])
    assert _records(dest / "kit-standin" / "overhead.jsonl")
    halves = [
        {r["config"] for r in _records(dest / leg / "sweep.jsonl") if r.get("type") == "config"} - {"plain"}
        for leg in ("sweep-1", "sweep-2")
    ]
    assert halves[0] and halves[1] and not halves[0] & halves[1]
    assert "SYNTHETIC" in (dest / "sweep-1" / "BENCHMARKS.partial.md").read_text()
    rows = json.loads((dest / "tune-study" / "tune-study.json").read_text())["rows"]
    assert [r["L"] for r in rows] == [2.0, 4.0] and all(r["pick_vs_best"] is not None for r in rows)
