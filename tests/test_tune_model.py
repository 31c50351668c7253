"""`dspark tune`'s pure parts: the cost model, per-position acceptance, the prediction, the pick, the record,
the cost table and the models.toml override. Numbers from BENCHMARKS.md's H200 study where it has them."""

from __future__ import annotations

import json
import math

import pytest
from support.cli import REPO
from support.scripts import script

from dsparkcli.bench import tune, tuned
from dsparkcli.bench.tune import Acceptance, Candidate, Choice, CostModel, Prediction, TuningKey, TuningRecord
from dsparkcli.errors import UsageError
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama.protocol import SpecCounters

# BENCHMARKS.md, run 680f74: t1 and the all-rejected step costs (ms), s fitted over 56 cells
H200 = CostModel(t1_ms=4.431, t_step_ms=((1, 6.89), (2, 7.64), (3, 9.75), (5, 11.93), (7, 13.66), (10, 19.78),
                                          (15, 22.53)), s_ms=0.561)


def _acc(per_pos, steps, *, budget=None, tokens=None, requests=1, drafted=None, p_min=0.0, category="c"):
    budget = budget or len(per_pos)
    accepted = sum(per_pos)
    tokens = tokens if tokens is not None else requests + steps + accepted  # every round a step
    return Acceptance(category, budget, p_min, SpecCounters(drafted=drafted if drafted is not None else steps * budget,
                                                             accepted=accepted, steps=steps,
                                                             accepted_per_pos=tuple(per_pos)), tokens, requests)


def test_break_even_matches_the_h200_table():
    # BENCHMARKS.md "break-even L with s": 1.64 1.83 2.37 2.94 3.38 4.97 5.68
    got = [round(H200.break_even(k), 2) for k in (1, 2, 3, 5, 7, 10, 15)]
    assert got == [1.64, 1.83, 2.37, 2.94, 3.38, 4.97, 5.68]


def test_prediction_is_the_benchmarks_model():
    # general, L 3.501, k 3: the cell's tau 3.59 -> model tau*t1/(t_step + (tau-1)*s) = 1.42 (measured 1.36)
    acc = Acceptance("general", 3, 0.0, SpecCounters(3000, 2590, 1000, (1000, 860, 730)), 1 + 1000 + 2590, 1)
    assert acc.tokens_per_step(3) == pytest.approx(3.59)
    assert tune.predict_speedup(H200, acc, 3) == pytest.approx(3.59 * 4.431 / (9.75 + 2.59 * 0.561))
    assert round(tune.predict_speedup(H200, acc, 3), 2) == 1.42


def test_smaller_budgets_see_the_first_positions_only():
    acc = _acc([90, 60, 30, 10], 100)
    assert [acc.tokens_per_step(k) for k in (1, 2, 3, 4)] == [1.9, 2.5, 2.8, 2.9]
    assert acc.rates() == pytest.approx([0.9, 60 / 90, 0.5, 1 / 3])
    with pytest.raises(ValueError, match="budget 4"):
        tune.predict_speedup(H200, acc, 5)


def test_rounds_without_a_draft_cost_plain_time():
    # p_min cut 38 rounds to nothing: 20 steps yield 60 tokens, 38 plain rounds 38 tokens, + 2 first tokens
    acc = _acc([20, 20], 20, budget=2, tokens=100, requests=2, drafted=40, p_min=0.5)
    assert acc.plain_rounds == 38
    assert acc.step_fraction == pytest.approx(20 / 58)
    cost = CostModel(t1_ms=1.0, t_step_ms=((2, 2.0),), s_ms=0.0)
    # per round: q*3 + (1-q) tokens in q*2 + (1-q)*1 ms
    q = 20 / 58
    assert tune.predict_speedup(cost, acc, 2) == pytest.approx((q * 3 + 1 - q) / (q * 2 + 1 - q))


def test_step_cost_interpolates_between_measured_budgets():
    assert H200.step(4) == pytest.approx((9.75 + 11.93) / 2)
    assert H200.step(0.5) == 6.89 and H200.step(20) == 22.53


def test_fit_s_recovers_the_per_token_cost():
    cells = []
    for k, per_pos, steps in ((5, [80, 60, 40, 20, 10], 100), (7, [90, 80, 70, 60, 50, 40, 30], 100)):
        acc = _acc(per_pos, steps, budget=k)
        tau = acc.tokens_per_step(k)
        cells.append((acc, (H200.step(k) + (tau - 1) * 0.561) / tau))  # ms per token the model says
    assert tune.fit_s(replace_s(H200, 0.0), cells) == pytest.approx(0.561)
    assert tune.fit_s(H200, []) == 0.0


def replace_s(cost, s):
    return CostModel(cost.t1_ms, cost.t_step_ms, s)


def test_synth_rates_are_llama_cpps():
    assert tune.synth_rates(16.0, 15) == (1.0,) * 15
    assert tune.synth_rates(1.0, 7) == (0.0,) * 7
    rates = tune.synth_rates(3.501, 15)
    assert 1 + sum(rates) == pytest.approx(3.501, abs=1e-6)
    p = rates[0]
    assert rates == pytest.approx(tuple(p ** (i + 1) for i in range(15)))
    with pytest.raises(ValueError):
        tune.synth_rates(9.0, 7)


def test_choice_measured_wins_and_plain_when_nothing_pays():
    preds = [Prediction("c", Candidate(3, 0.0), 1.40, 3.0), Prediction("c", Candidate(5, 0.0), 1.35, 4.0),
             Prediction("c", Candidate(7, 0.0), 1.40, 4.5)]
    assert tune.choose(preds, "c").candidate == Candidate(3, 0.0)  # tie -> the smaller budget
    measured = {Candidate(3, 0.0): 1.20, Candidate(5, 0.0): 1.31}
    ch = tune.choose(preds, "c", measured)
    assert (ch.candidate, ch.predicted, ch.measured) == (Candidate(5, 0.0), 1.35, 1.31)
    assert tune.choose(preds, "c", {Candidate(3, 0.0): 0.97}).candidate is None
    assert tune.choose([Prediction("c", Candidate(1, 0.0), 0.8, 1.2)], "c").candidate is None
    assert tune.shortlist(preds, ["c"], 2) == [Candidate(3, 0.0), Candidate(7, 0.0)]


def test_cost_flags_and_the_key():
    argv = ["llama-server", "-m", "t.gguf", "-ngl", "99", "--flash-attn", "on", "-c", "4096", "--threads=8",
            "--spec-draft-n-max", "5", "-np", "1"]
    assert tune.cost_flags(argv) == (("ctx", "4096"), ("fa", "on"), ("ngl", "99"), ("np", "1"), ("threads", "8"))
    key = TuningKey("a" * 64, "b" * 64, "0c1e570", "cuda", "NVIDIA H200", tune.cost_flags(argv))
    other = TuningKey("a" * 64, "b" * 64, "0c1e570", "cuda", "NVIDIA H200", (("np", "1"),))
    assert key.id != other.id and len(key.id) == 16
    assert TuningKey.from_record(json.loads(json.dumps(key.to_record()))) == key
    assert other.differences(key) == ["ctx 4096 (here default)", "fa on (here default)", "ngl 99 (here default)",
                                      "threads 8 (here default)"]


def _record() -> TuningRecord:
    acc = _acc([90, 60, 30, 10], 100, category="code")
    preds = tuple(tune.predict_all(H200, [acc], [1, 2, 3]))
    return TuningRecord(key=TuningKey("a" * 64, "b" * 64, "abc", "cpu", "none", (("ctx", "4096"),)), cost=H200,
                        acceptance=(acc,), predictions=preds, choices=(Choice("code", Candidate(3, 0.0), 1.5, 1.4),
                                                                       Choice("all", None, None, 1.0)),
                        verified=(("code", "k=3", 1.4),), budgets=(1, 2, 3), timings_s={"total": 1.5},
                        created="2026-12-01T00:00:00+00:00", run_id="r", jsonl="x.jsonl")


def test_record_round_trips_and_exports_the_cost_table():
    rec = _record()
    back = TuningRecord.from_record(json.loads(json.dumps(rec.to_record())))
    assert back == rec
    assert back.choice("code").candidate == Candidate(3, 0.0) and back.choice().candidate is None
    lines = tune.cost_table(H200).splitlines()
    assert [ln for ln in lines if not ln.startswith("#")] == [
        "s 0.561000", "0 4.431000", "1 6.890000", "2 7.640000", "3 9.750000", "5 11.930000", "7 13.660000",
        "10 19.780000", "15 22.530000"]
    with pytest.raises(ValueError):
        TuningRecord.from_record({"kind": "something else"})


def test_apply_writes_an_override_the_registry_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path))
    path = tmp_path / "models.toml"
    path.write_text('# mine\ndefault = "minicpm-v-4.7"\n')
    tuned.apply_to_models("minicpm-v-4.7", Choice("all", Candidate(7, 0.3), 1.6, 1.5), "k1")
    pair = load_registry().get("minicpm-v-4.7")
    assert (pair.budget, pair.p_min) == (7, 0.3) and pair.target.repo.startswith("esatapedico/")
    tuned.apply_to_models("minicpm-v-4.7", Choice("all", Candidate(3, 0.0), 1.4, 1.3), "k2")  # replaces its block
    text = path.read_text()
    assert text.count(tuned.APPLY_MARK) == 1 and "budget = 3" in text and "p_min" not in text
    assert text.startswith("# mine\ndefault")
    assert load_registry().get("minicpm-v-4.7").budget == 3
    with pytest.raises(UsageError, match="nothing to apply"):
        tuned.apply_to_models("minicpm-v-4.7", Choice("all", None, None, 1.0), "k3")


def test_apply_leaves_a_users_own_pair_alone(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[pairs."mine"]\ndescription = "x"\n')
    with pytest.raises(UsageError, match="already defines pair mine"):
        tuned.apply_to_models("mine", Choice("all", Candidate(5, 0.0), 1.2, 1.1), "k", path)
    assert path.read_text() == '[pairs."mine"]\ndescription = "x"\n'


def test_override_of_an_unknown_pair_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path))
    (tmp_path / "models.toml").write_text('[pairs."nope"]\nbudget = 3\n')
    with pytest.raises(UsageError, match="no earlier models.toml defines this pair"):
        load_registry()


def test_parse_auto():
    assert tuned.parse_auto("auto", "--budget", int) == (None, True)
    assert tuned.parse_auto("AUTO", "--budget", int) == (None, True)
    assert tuned.parse_auto("7", "--budget", int) == (7, False)
    assert tuned.parse_auto(None, "--budget", int) == (None, False)
    with pytest.raises(UsageError, match="number or 'auto'"):
        tuned.parse_auto("seven", "--budget", int)
    assert math.isclose(tuned.parse_auto("0.5", "--p-min", float)[0], 0.5)


def test_benchmarks_quotes_the_committed_tuning_record():
    """BENCHMARKS.md's tune table is scripts/tune_to_md.py's rendering of the committed record, unedited."""
    src = "results/cpu/tune-smollm2-135m.json"
    rec = TuningRecord.from_record(json.loads((REPO / src).read_text()))
    assert rec.complete and rec.key.backend == "cpu" and rec.choice().candidate is None  # plain won there
    assert script("tune_to_md").record_md(rec, src).strip() in (REPO / "BENCHMARKS.md").read_text()
    assert tuned.parse_auto("adaptive", "--budget", int, adaptive=True) == (tuned.ADAPTIVE, False)
    with pytest.raises(UsageError, match="number, 'auto' or 'adaptive'"):
        tuned.parse_auto("x", "--budget", int, adaptive=True)
    with pytest.raises(UsageError, match="number or 'auto'"):
        tuned.parse_auto("adaptive", "--budget", int)  # where adaptive has no meaning (--p-min, vllm)
