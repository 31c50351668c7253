"""`dspark tune` on the real llama-server with synthetic known-answer pairs.

* The per-position acceptance tune reads from /metrics equals synth.predict_from_last summed over prompts
  x reps, exactly, with and without a confidence threshold.
* Tune's pick equals the argmax of a brute-force grid (`dspark bench`'s runner, every budget, plain
  included) measured on the same pair in the same test. The pairs are built so the answer is clear on a
  loaded 2-core machine: a draft that is always right (the largest budget wins by ~1.5x) and one that is
  always wrong (plain decoding wins by > 2x).
* The CLI: --json, the stored record, `run` / `bench` with --budget auto, the one line when no tuning
  matches, Ctrl-C.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsparkcli.bench import tuning
from dsparkcli.bench.plan import BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import PLAIN, PromptRecord, read_jsonl
from dsparkcli.bench.requests import MEDIA_MARKER
from dsparkcli.bench.run import run_bench
from dsparkcli.bench.summaries import ALL
from dsparkcli.budget import methods, store
from dsparkcli.budget import model as tune
from dsparkcli.errors import BenchError
from dsparkcli.synth import known_answer as synth
from support.cli import REPO, interrupt_when
from support.plans import device_dir, dry_run_plan

PROMPTS = tuple(
    Prompt(f"{c}-{i}", c, f"{c} question number {i}, answer briefly") for c in ("alpha", "beta") for i in range(2)
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))  # the tuning store, per test


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Some rows wrong, scripted confidence: non-trivial per-position acceptance, with and without p_min."""
    return synth.write_pair(
        tmp_path_factory.mktemp("tune-mixed"), vocab=128, accept_rate=0.7, confidence=True, seed=11
    )


@pytest.fixture(scope="module")
def right(tmp_path_factory):
    """Always right, a target 12x dearer than the tiny default: the largest budget pays."""
    return synth.write_pair(
        tmp_path_factory.mktemp("tune-right"), vocab=128, accept_rate=1.0, seed=3, target_layers=24
    )


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    """Always wrong, the tiny target: every step costs several plain tokens and yields one; plain pays."""
    return synth.write_pair(tmp_path_factory.mktemp("tune-wrong"), vocab=128, accept_rate=0.0, seed=4)


def _plan(pair, **kw) -> tuning.TunePlan:
    base = dict(target=pair.target, draft=pair.draft, prompts=PROMPTS, threads=1, ctx=1024, reuse_cost=False)
    return tuning.TunePlan(**{**base, **kw})


def test_measured_per_position_acceptance_is_the_synthetic_prediction(engine, mixed, tmp_path):
    n, reps, k = 48, 2, 8
    out = tmp_path / "tune.jsonl"
    rec = tuning.run_tune(
        engine, _plan(mixed, budgets=(k,), p_mins=(0.0, 0.5), n_predict=n, reps=reps, top=1), out=out
    )
    man = synth.load_manifest(mixed.manifest)
    rendered = {
        r["prompt_id"]: PromptRecord.from_record(r).rendered
        for r in read_jsonl(out, f"{rec.run_id}-acceptance")
        if r["record"] == "prompt"
    }
    assert set(rendered) == {p.id for p in PROMPTS}
    for p_min in (0.0, 0.5):
        for cat in ("alpha", "beta"):
            preds = [
                synth.predict_from_last(
                    man, synth.last_prompt_token(man, rendered[p.id], MEDIA_MARKER), n_max=k, n_predict=n, p_min=p_min
                )
                for p in PROMPTS
                if p.category == cat
            ]
            got = next(a for a in rec.acceptance if a.category == cat and a.p_min == p_min)
            width = max(len(got.counters.accepted_per_pos), k)
            expect_pp = [
                reps * sum(pr.accepted_per_pos[i] if i < len(pr.accepted_per_pos) else 0 for pr in preds)
                for i in range(width)
            ]
            assert (
                list(got.counters.accepted_per_pos) + [0] * (width - len(got.counters.accepted_per_pos)) == expect_pp
            )
            assert got.counters.steps == reps * sum(pr.steps for pr in preds)
            assert got.counters.drafted == reps * sum(pr.draft_n for pr in preds)
            assert got.counters.accepted == reps * sum(pr.draft_n_accepted for pr in preds)
            assert got.tokens == reps * sum(len(pr.tokens) for pr in preds) and got.requests == reps * len(preds)
            assert 0 < sum(expect_pp) < got.counters.drafted  # neither all nor nothing accepted
    # p_min 0.5 cuts blocks: fewer drafts per step than without it, on the same prompts
    a0 = tune.pooled([a for a in rec.acceptance if a.p_min == 0.0])
    a5 = tune.pooled([a for a in rec.acceptance if a.p_min == 0.5])
    assert a5.counters.drafted / a5.counters.steps < a0.counters.drafted / a0.counters.steps
    assert a5.plain_rounds > 0
    # and the record a later --budget auto reads is on disk
    assert store.find(rec.key) == rec


N, REPS = 64, 3
ATTEMPTS = 3  # two cores shared with other work: a whole arm can run at half speed, so the check is retried


def _grid_argmax(engine, pair, budgets, tmp_path) -> dict[str, int | None]:
    """Every budget and plain through `dspark bench`'s runner; per category the budget with the highest
    speedup (None: plain decoding)."""
    plan = BenchPlan(
        target=pair.target,
        drafts=(Draft("d", pair.draft),),
        budgets=budgets,
        prompts=PROMPTS,
        reps=REPS,
        n_predict=N,
        ctx=1024,
        threads=1,
    )
    res = run_bench(engine, plan, out=tmp_path / "grid.jsonl")
    best: dict[str, tuple[float, int | None]] = {}
    for s in res.summaries:
        speed = 1.0 if s.config == PLAIN else s.speedup
        cat = tune.OVERALL if s.category == ALL else s.category
        if cat not in best or speed > best[cat][0]:
            best[cat] = (speed, s.budget)
    return {cat: b for cat, (_, b) in best.items()}


@pytest.mark.parametrize("which,budgets,expected", [("right", (1, 8), 8), ("wrong", (4, 8), None)])
def test_tunes_pick_is_the_argmax_of_a_brute_force_grid(engine, right, wrong, tmp_path, which, budgets, expected):
    pair = right if which == "right" else wrong
    seen = []
    for attempt in range(ATTEMPTS):
        rec = tuning.run_tune(
            engine, _plan(pair, budgets=budgets, n_predict=N, reps=REPS, top=2), out=tmp_path / f"t{attempt}.jsonl"
        )
        grid = _grid_argmax(engine, pair, budgets, tmp_path / f"g{attempt}")
        picks = {c.category: (c.candidate.budget if c.candidate else None) for c in rec.choices}
        seen.append((picks, grid))
        if picks == grid:
            break
    assert picks == grid, f"tune vs grid in {ATTEMPTS} attempts: {seen}"
    assert set(picks.values()) == {expected}  # the known answer these pairs are built for
    # the cost model is measured: steps dearer than a plain token; 8 drafts dearer than 1 (4 and 8 cost about the
    # same on these tiny models: one draft pass and one verification batch each, their order is timing noise)
    assert 0 < rec.cost.t1_ms < min(rec.cost.step(budgets[0]), rec.cost.step(8))
    if budgets[0] == 1:
        assert rec.cost.step(1) < rec.cost.step(8)
    assert set(rec.timings_s) >= {"cost", "acceptance", "verify", "total"}


def _env(engine, tmp_path) -> dict[str, str]:
    return {
        "DSPARK_LLAMA_BIN": str(engine.bin_dir),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
    }


def test_cli_tune_then_budget_auto(engine, right, cli, tmp_path):
    env = _env(engine, tmp_path)
    prompts = _write_prompts(tmp_path)
    files = ["--target", str(right.target), "--draft", str(right.draft)]
    t0 = time.monotonic()
    proc = cli(
        "tune",
        *files,
        "--prompts",
        str(prompts),
        "--budgets",
        "1",
        "8",
        "--methods",  # the budget's flow: run --budget auto then runs a budget (tests/test_tune_methods.py: methods)
        "plain",
        "dspark",
        "-n",
        "64",
        "--reps",
        "2",
        "--threads",
        "1",
        "--ctx",
        "1024",
        "--json",
        "--cost-table",
        str(tmp_path / "cost.txt"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["complete"] is True and Path(doc["stored"]).is_file()
    assert set(doc["timings_s"]) >= {"cost", "acceptance", "verify", "total"}
    assert doc["timings_s"]["total"] < time.monotonic() - t0
    overall = next(c for c in doc["choices"] if c["category"] == "all")
    chosen = overall["budget"]  # whatever this loaded machine measured: run and bench must use exactly it
    assert chosen in (1, 8) or (chosen is None and overall["plain"])
    table = [ln.split() for ln in (tmp_path / "cost.txt").read_text().splitlines() if not ln.startswith("#")]
    assert [row[0] for row in table] == ["s", "0", "1", "8"]
    assert float(table[1][1]) == pytest.approx(doc["cost"]["t1_ms"], rel=1e-5)

    ask = ("run", *files, "hello there", "-n", "8", "--json")
    proc = cli(*ask, "--budget", "auto", "--threads", "1", "--ctx", "2048", env=env)  # -c is not in the key
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    if chosen is not None:
        assert result["budget"] == chosen
        assert f"tuning {doc['key_id']}: budget {chosen} (" in proc.stderr
    else:  # plain decoding won: no draft at all, said so (never a fixed budget tune measured slower)
        assert result["budget"] is None and "-md" not in result["server_argv"]
        assert f"tuning {doc['key_id']}: plain decoding beat every budget" in proc.stderr
        assert "so the draft is not loaded and every request decodes as plain does" in proc.stderr
    proc = cli(*ask, "--budget", "auto", "--threads", "2", env=env)  # -t changes the speed: no match, named
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["budget"] == 5
    assert (
        "--budget auto: no tuning matches this pair, engine and settings: it was tuned with --threads 1 "
        "(here 2); using budget 5"
    ) in proc.stderr
    proc = cli(
        "bench",
        *files,
        "--prompts",
        str(prompts),
        "--budget",
        "auto",
        "2",
        "--reps",
        "1",
        "-n",
        "16",
        "--threads",
        "1",
        "--ctx",
        "1024",
        "--json",
        "--out",
        str(tmp_path / "b.jsonl"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["summaries"]
    # picks that differ by category (timing under load decides them): one server at the largest, each request
    # its category's own budget (0: no draft), as bench says; else the overall pick's arm
    picks = {c["category"]: c["budget"] or 0 for c in doc["choices"]}
    by_prompt = {picks.get(p.category, picks["all"]) for p in PROMPTS}
    if chosen is not None:
        auto = max(by_prompt) if len(by_prompt) > 1 else chosen
        assert {s["budget"] for s in rows} == {None, 2, auto}
    else:  # the auto arm runs as run --budget auto does: without the draft
        label = right.draft.name.removesuffix(".gguf")
        assert {s["config"] for s in rows} == {"plain", f"{label}@2", f"{label}@auto"}
        auto_rows = [s for s in rows if s["config"] == f"{label}@auto" and s["category"] != "all"]
        assert auto_rows and all(s["drafted"] == 0 for s in auto_rows if not picks.get(s["category"], picks["all"]))
        if not any(picks.values()):
            assert {s["drafted"] for s in rows if s["config"] == f"{label}@auto"} == {0}
    proc = cli(*ask, "--budget", "eight", env=env)
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == "dspark: error: --budget must be a number, 'auto' or 'adaptive' (got 'eight')"
    )


def test_ctrl_c_keeps_what_was_measured(engine, right, tmp_path):
    out = tmp_path / "t.jsonl"
    rc, _, stderr, _ = interrupt_when(
        [
            "tune",
            "--target",
            str(right.target),
            "--draft",
            str(right.draft),
            "--prompts",
            str(_write_prompts(tmp_path)),
            "--budgets",
            "1",
            "2",
            "4",
            "8",
            "--reps",
            "40",
            "-n",
            "64",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        lambda: out.is_file() and out.read_text().count('"record":"request"') >= 5,
        env=_env(engine, tmp_path),
    )
    assert rc == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("dspark: error: interrupted: what was measured is kept")
    assert "Traceback" not in stderr
    assert sum(1 for r in read_jsonl(out) if r["record"] == "request") >= 5
    partial = json.loads(out.with_suffix(".partial.json").read_text())
    assert partial["complete"] is False
    assert not list((tmp_path / "cache" / "tuning").glob("*.json"))  # nothing --budget auto would read


def _write_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(json.dumps({"id": p.id, "category": p.category, "prompt": p.text}) + "\n" for p in PROMPTS)
    )
    return path


def test_cli_tuning_a_second_category_keeps_the_first(engine, right, cli, tmp_path):
    """Issue 28 item 11: `tune --category alpha` then `tune --category beta` of the same pair and settings: the
    stored tuning holds both picks (the second run replaced the first before) and says it kept alpha's."""
    env = _env(engine, tmp_path)
    common = ["--target", str(right.target), "--draft", str(right.draft), "--prompts", str(_write_prompts(tmp_path))]
    common += ["--budgets", "1", "8", "--methods", "plain", "dspark", "-n", "24", "--reps", "1"]
    common += ["--threads", "1", "--ctx", "1024", "--json"]
    first = cli("tune", *common, "--category", "alpha", env=env)
    assert first.returncode == 0, first.stderr
    alpha = next(c for c in json.loads(first.stdout)["choices"] if c["category"] == "alpha")
    second = cli("tune", *common, "--category", "beta", env=env)
    assert second.returncode == 0, second.stderr
    doc = json.loads(second.stdout)
    assert doc["kept_categories"] == ["alpha"]
    assert doc["stored"] == json.loads(first.stdout)["stored"]  # one key: the same pair, engine and settings
    stored = {c["category"]: c for c in json.loads(Path(doc["stored"]).read_text())["choices"]}
    assert {"alpha", "beta"} <= set(stored) and stored["alpha"] == alpha


def test_the_tune_study_runs_here(engine, right, tmp_path):
    """study/tune_study.py (tune vs a full grid per acceptance length): the H200 command, on the CPU engine with
    small settings."""
    env = {**os.environ, **_env(engine, tmp_path), "PYTHONPATH": str(REPO), "PYTHON": sys.executable}
    out = tmp_path / "study"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "study.tune_study",
            "--target",
            str(right.target),
            "--draft",
            str(right.draft),
            "--out",
            str(out),
            "--lengths",
            "2",
            "4",
            "--budgets",
            "1",
            "3",
            "--n-predict",
            "24",
            "--cost-n-predict",
            "12",
            "--grid-n-predict",
            "24",
            "--grid-reps",
            "1",
            "--threads",
            "1",
            "--ctx",
            "1024",
            "--adaptive",
            "--tune-adaptive",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "tune-study.json").read_text())
    assert [r["L"] for r in summary["rows"]] == [2.0, 4.0]
    for row in summary["rows"]:
        assert set(row["grid"]) == {"1", "3"}  # JSON keys: every budget of the grid was measured
        assert row["tune_pick"] in (None, 1, 3) and row["pick_vs_best"] is not None
        # --adaptive: the grid has it; --tune-adaptive: tune's verification too
        assert row["adaptive_in_grid"] > 0 and row["tune_adaptive_measured"] > 0
        assert row["tune_adaptive_vs_pick"] == pytest.approx(
            row["tune_adaptive_measured"] / (row["tune_measured"] or 1.0)
        )
    assert summary["rows"][1]["timings_s"].get("cost_reused") == 1.0  # the cost model is measured once
    assert summary["tune_wall_s"] > 0 and summary["grid_wall_s"] > 0
    records = [json.loads(ln) for ln in (out / "tune-records.jsonl").read_text().splitlines()]
    assert [r["synth_len"] for r in records] == [2.0, 4.0] and all(r["synthetic"] for r in records)


@pytest.mark.engine
def test_the_tune_plan_dry_runs_here(engine, tmp_path, monkeypatch):
    """study/plans/tune.toml (the former study/tune_real.sh: tune, then --budget auto through run, serve and
    bench), dry-run by the lease tool on the CPU engine with its known-answer pair and tiny sizes."""
    real = dry_run_plan("tune", engine, tmp_path, monkeypatch) / "tune-real"
    target = str(device_dir(tmp_path) / "pair" / "target-llama.gguf")
    rec = json.loads((real / "tune.json").read_text())
    overall = next(c for c in rec["choices"] if c["category"] == "all")
    # run and serve --budget auto run tune's overall method pick (timing under load decides it): the DSpark draft
    # at the overall budget (None: plain won every budget), a chain at its measured budget, else no draft at all
    method = {m["category"]: m["method"] for m in rec["method_choices"]}["all"]
    budget = overall["budget"] if method == "dspark" else methods.budget_of(method)
    assert json.loads((real / "run.json").read_text())["budget"] == budget
    served = json.loads((real / "serve.json").read_text())
    assert served["budget"] == budget
    if served["draft"]:  # the tuning's pick per category, for clients that send their own speculative.n_max
        assert served["category_budgets"] == {c["category"]: c["budget"] or 0 for c in rec["choices"]}
    else:
        assert served["category_budgets"] is None
    # bench's auto arm follows tune's picks for the categories it ran (timing under load decides them): one pick
    # for all -> that budget's arm; picks that differ by category -> one server at the largest, each request its own
    by_category = {c["category"]: c for c in rec["choices"]}
    lines = (real / "bench.jsonl").read_text().splitlines()
    benched = {json.loads(ln).get("category") for ln in lines} - {None, "all"}
    picks = {(c["budget"] or 0, c["p_min"] or 0.0) for c in (by_category.get(k, overall) for k in benched)}
    per_category = len(picks) > 1 and any(k for k, _ in picks)
    bench_budgets = {s["budget"] for s in json.loads((real / "bench.json").read_text())["summaries"]}
    if per_category:
        assert "--budget auto per category: " in (real / "tune.log").read_text()
        assert max(k for k, _ in picks) in bench_budgets
    else:  # bench's auto is the DSpark budget alone (no method pick): the overall one, None when plain won
        assert overall["budget"] in bench_budgets
    assert (real / "cost-table.txt").read_text().startswith("# dspark tune cost table")
    # the leg's `serve` is stopped, with its llama-server: nothing of this pair is left running
    left = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if target in cmd:
            left.append(cmd[:200])
    assert not left, left


def test_max_minutes_stops_and_keeps_what_was_measured(engine, right, tmp_path):
    out = tmp_path / "t.jsonl"
    with pytest.raises(BenchError, match="ran out of time in its cost phase"):
        tuning.run_tune(engine, _plan(right, budgets=(1, 8), n_predict=16, deadline=time.monotonic()), out=out)
    assert any(r["record"] == "prompt" for r in read_jsonl(out))  # what the first server wrote is kept
    assert json.loads(out.with_suffix(".partial.json").read_text())["complete"] is False
    assert store.stored() == []  # nothing --budget auto would read


def test_tune_then_bench_auto_and_adaptive_with_each_commands_defaults(engine, right, cli, tmp_path):
    """README's flow, `dspark tune` then `dspark bench --budget auto adaptive`, with neither given a speed setting:
    tune serves without -c, bench with -c 4096 by default, and both find the one key (issue 30: tune keyed
    `(np 1)`, bench `(ctx 4096, np 1)`, and bench refused). Only the workload is made small (not in the key)."""
    env = _env(engine, tmp_path)
    files = ["--target", str(right.target), "--draft", str(right.draft)]
    prompts = str(_write_prompts(tmp_path))
    proc = cli("tune", *files, "--prompts", prompts, "--budgets", "1", "4", "-n", "24", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["key"]["flags"] == {"np": "1"}
    proc = cli(
        "bench",
        *files,
        "--prompts",
        prompts,
        "--budget",
        "auto",
        "adaptive",
        "-n",
        "16",
        "--reps",
        "1",
        "--json",
        "--out",
        str(tmp_path / "b.jsonl"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"adaptive budget: llama.cpp picks 0..4 per step from tuning {doc['key_id']}'s step costs" in proc.stderr
    assert f"tuning {doc['key_id']}: " in proc.stderr
    overall = next(c for c in doc["choices"] if c["category"] == "all")
    label = right.draft.name.removesuffix(".gguf")
    # the auto arm follows tune's picks (timing under load decides them): one pick for every category -> that
    # budget's arm (or "@auto" without the draft); picks that differ by category -> "@auto", one per request
    by_category = {c["category"]: c for c in doc["choices"]}
    picks = {(c["budget"] or 0, c["p_min"] or 0.0) for c in (by_category.get(p.category, overall) for p in PROMPTS)}
    per_category = len(picks) > 1 and any(k for k, _ in picks)
    auto_config = f"{label}@{overall['budget']}" if overall["budget"] and not per_category else f"{label}@auto"
    if per_category:
        assert "--budget auto per category: " in proc.stderr
    configs = {s["config"] for s in json.loads(proc.stdout)["summaries"]}
    assert configs == {"plain", auto_config, f"{label}@adaptive"}
    argv = next(
        r["server_argv"]
        for r in map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())
        if r["record"] == "request" and r["config"] == f"{label}@adaptive"
    )
    assert "-c" not in argv and "-t" not in argv  # bench's own defaults (the model's context), tune's key
    # and a setting that does change speed is named when it differs, for both words alike
    for word in ("auto", "adaptive"):
        proc = cli("bench", *files, "--prompts", prompts, "--budget", word, "-n", "8", "--threads", "1", env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == (
            f"dspark: error: --budget {word}: no tuning matches this pair, engine and "
            "settings: it was tuned with --threads default (here 1)"
        )
