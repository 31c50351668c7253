"""`dspark tune`'s pure parts: the cost model, per-position acceptance, the prediction, the pick, the record,
the cost table and the models.toml override. Numbers from BENCHMARKS.md's H200 study where it has them."""

from __future__ import annotations

import json
import math

import pytest

from dsparkcli.budget import model as tune
from dsparkcli.budget.apply import APPLY_MARK, apply_to_models
from dsparkcli.budget.key import TuningKey, speed_flags
from dsparkcli.budget.limits import ADAPTIVE, parse_auto
from dsparkcli.budget.model import Acceptance, Candidate, Choice, CostModel, Prediction
from dsparkcli.budget.record import TuningRecord
from dsparkcli.errors import UsageError
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama.protocol import SpecCounters
from support.cli import REPO
from support.scripts import script

# BENCHMARKS.md, run 680f74: t1 and the all-rejected step costs (ms), s fitted over 56 cells
H200 = CostModel(
    t1_ms=4.431,
    t_step_ms=((1, 6.89), (2, 7.64), (3, 9.75), (5, 11.93), (7, 13.66), (10, 19.78), (15, 22.53)),
    s_ms=0.561,
)


def _acc(per_pos, steps, *, budget=None, tokens=None, requests=1, drafted=None, p_min=0.0, category="c"):
    budget = budget or len(per_pos)
    accepted = sum(per_pos)
    tokens = tokens if tokens is not None else requests + steps + accepted  # every round a step
    return Acceptance(
        category,
        budget,
        p_min,
        SpecCounters(
            drafted=drafted if drafted is not None else steps * budget,
            accepted=accepted,
            steps=steps,
            accepted_per_pos=tuple(per_pos),
        ),
        tokens,
        requests,
    )


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
    preds = [
        Prediction("c", Candidate(3, 0.0), 1.40, 3.0),
        Prediction("c", Candidate(5, 0.0), 1.35, 4.0),
        Prediction("c", Candidate(7, 0.0), 1.40, 4.5),
    ]
    assert tune.choose(preds, "c").candidate == Candidate(3, 0.0)  # tie -> the smaller budget
    measured = {Candidate(3, 0.0): 1.20, Candidate(5, 0.0): 1.31}
    ch = tune.choose(preds, "c", measured)
    assert (ch.candidate, ch.predicted, ch.measured) == (Candidate(5, 0.0), 1.35, 1.31)
    assert tune.choose(preds, "c", {Candidate(3, 0.0): 0.97}).candidate is None
    assert tune.choose([Prediction("c", Candidate(1, 0.0), 0.8, 1.2)], "c").candidate is None
    assert tune.shortlist(preds, ["c"], 2) == [Candidate(3, 0.0), Candidate(7, 0.0)]


def test_speed_flags_and_the_key():
    argv = [
        "llama-server",
        "-m",
        "t.gguf",
        "-ngl",
        "99",
        "--flash-attn",
        "on",
        "-c",
        "4096",
        "--threads=8",
        "--spec-draft-n-max",
        "5",
        "-np",
        "1",
    ]
    # -c is not a speed setting: llama.cpp attends over the cells in use, not the allocated context
    assert speed_flags(argv) == (("fa", "on"), ("ngl", "99"), ("np", "1"), ("threads", "8"))
    key = TuningKey("a" * 64, "b" * 64, "0c1e570", "cuda", "NVIDIA H200", speed_flags(argv))
    other = TuningKey("a" * 64, "b" * 64, "0c1e570", "cuda", "NVIDIA H200", (("np", "1"),))
    assert key.id != other.id and len(key.id) == 16
    assert TuningKey.from_record(json.loads(json.dumps(key.to_record()))) == key
    assert other.differences(key) == ["-fa on (here default)", "-ngl 99 (here default)", "--threads 8 (here default)"]


def _record() -> TuningRecord:
    acc = _acc([90, 60, 30, 10], 100, category="code")
    preds = tuple(tune.predict_all(H200, [acc], [1, 2, 3]))
    return TuningRecord(
        key=TuningKey("a" * 64, "b" * 64, "abc", "cpu", "none", (("ctx", "4096"),)),
        cost=H200,
        acceptance=(acc,),
        predictions=preds,
        choices=(Choice("code", Candidate(3, 0.0), 1.5, 1.4), Choice("all", None, None, 1.0)),
        verified=(("code", "k=3", 1.4),),
        budgets=(1, 2, 3),
        timings_s={"total": 1.5},
        created="2026-12-01T00:00:00+00:00",
        run_id="r",
        jsonl="x.jsonl",
    )


def test_record_round_trips_and_exports_the_cost_table():
    rec = _record()
    back = TuningRecord.from_record(json.loads(json.dumps(rec.to_record())))
    assert back == rec
    assert back.choice("code").candidate == Candidate(3, 0.0) and back.choice().candidate is None
    lines = tune.cost_table(H200).splitlines()
    assert [ln for ln in lines if not ln.startswith("#")] == [
        "s 0.561000",
        "0 4.431000",
        "1 6.890000",
        "2 7.640000",
        "3 9.750000",
        "5 11.930000",
        "7 13.660000",
        "10 19.780000",
        "15 22.530000",
    ]
    with pytest.raises(ValueError):
        TuningRecord.from_record({"kind": "something else"})


def test_apply_writes_an_override_the_registry_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path))
    path = tmp_path / "models.toml"
    path.write_text('# mine\ndefault = "minicpm-v-4.7"\n')
    apply_to_models("minicpm-v-4.7", Choice("all", Candidate(7, 0.3), 1.6, 1.5), "k1")
    pair = load_registry().get("minicpm-v-4.7")
    assert (pair.budget, pair.p_min) == (7, 0.3) and pair.target.repo.startswith("esatapedico/")
    apply_to_models("minicpm-v-4.7", Choice("all", Candidate(3, 0.0), 1.4, 1.3), "k2")  # replaces its block
    text = path.read_text()
    assert text.count(APPLY_MARK) == 1 and "budget = 3" in text and "p_min" not in text
    assert text.startswith("# mine\ndefault")
    assert load_registry().get("minicpm-v-4.7").budget == 3
    with pytest.raises(UsageError, match="nothing to apply"):
        apply_to_models("minicpm-v-4.7", Choice("all", None, None, 1.0), "k3")


def test_apply_leaves_a_users_own_pair_alone(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[pairs."mine"]\ndescription = "x"\n')
    with pytest.raises(UsageError, match="already defines pair mine"):
        apply_to_models("mine", Choice("all", Candidate(5, 0.0), 1.2, 1.1), "k", path)
    assert path.read_text() == '[pairs."mine"]\ndescription = "x"\n'


def test_override_of_an_unknown_pair_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path))
    (tmp_path / "models.toml").write_text('[pairs."nope"]\nbudget = 3\n')
    with pytest.raises(UsageError, match="no earlier models.toml defines this pair"):
        load_registry()


def test_parse_auto():
    assert parse_auto("auto", "--budget", int) == (None, True)
    assert parse_auto("AUTO", "--budget", int) == (None, True)
    assert parse_auto("7", "--budget", int) == (7, False)
    assert parse_auto(None, "--budget", int) == (None, False)
    with pytest.raises(UsageError, match="number or 'auto'"):
        parse_auto("seven", "--budget", int)
    assert math.isclose(parse_auto("0.5", "--p-min", float)[0], 0.5)


def test_benchmarks_quotes_the_committed_tuning_record():
    """BENCHMARKS.md's tune table is study/tune_to_md.py's rendering of the committed record, unedited."""
    src = "study/results/cpu/tune-smollm2-135m.json"
    rec = TuningRecord.from_record(json.loads((REPO / src).read_text()))
    assert rec.complete and rec.key.backend == "cpu" and rec.choice().candidate is None  # plain won there
    assert script("tune_to_md").record_md(rec, src).strip() in (REPO / "BENCHMARKS.md").read_text()
    assert parse_auto("adaptive", "--budget", int, adaptive=True) == (ADAPTIVE, False)
    with pytest.raises(UsageError, match="number, 'auto' or 'adaptive'"):
        parse_auto("x", "--budget", int, adaptive=True)
    with pytest.raises(UsageError, match="number or 'auto'"):
        parse_auto("adaptive", "--budget", int)  # where adaptive has no meaning (--p-min, vllm)


# ------------------------------------------------------------------ issue 30: every term fitted on its own cells


def _cell(cost: CostModel, acc: Acceptance) -> tuple[Acceptance, float]:
    """The ms per token ``cost`` gives a cell at its own budget: a scripted measurement."""
    k = acc.budget
    q = acc.step_fraction
    tokens = q * acc.tokens_per_step(k) + 1 - q
    ms = (
        q * (cost.step(acc.drafted_per_step(k)) + (acc.tokens_per_step(k) - 1) * cost.s_ms)
        + (1 - q) * cost.t1_ms
        + cost.p_min_extra(acc.p_min, k)
    )
    return acc, ms / tokens


def test_a_scripted_p_min_slowdown_is_not_charged_to_accepted_tokens():
    """Cells at budget 7 whose p-min path costs 0.2 / 0.4 ms per block position a round (1.6 / 3.2 ms at k 7,
    the H200's 4.2 -> 7.1 ms step): s comes back exactly from the p 0 cells, each threshold's term from its own;
    charged to accepted tokens, as the version 1 fit did, s comes out nearly twice too dear."""
    truth = CostModel(t1_ms=4.431, t_step_ms=H200.t_step_ms, s_ms=0.561, p_min_ms=((0.3, 0.2), (0.6, 0.4)))
    cells = []
    for cat, per_pos, steps in (
        ("code", [80, 60, 40, 20, 10, 5, 2], 100),
        ("math", [90, 80, 70, 60, 50, 40, 30], 100),
        ("general", [40, 10, 5, 1, 0, 0, 0], 100),
    ):
        cells.append(_cell(truth, _acc(per_pos, steps, budget=7, category=cat)))
        for p, cut in ((0.3, 20), (0.6, 45)):  # a threshold cuts rounds to nothing and blocks short
            acc = _acc(
                per_pos,
                steps - cut,
                budget=7,
                category=cat,
                p_min=p,
                drafted=(steps - cut) * 4,
                tokens=1 + (steps - cut) + sum(per_pos) + 2 * cut,
            )
            assert acc.plain_rounds == 2 * cut
            cells.append(_cell(truth, acc))
    start = CostModel(truth.t1_ms, truth.t_step_ms)
    fitted = tune.fit(start, cells)
    assert fitted.s_ms == pytest.approx(0.561, rel=1e-9)
    assert dict(fitted.p_min_ms) == pytest.approx({0.3: 0.2, 0.6: 0.4}, rel=1e-9)
    for acc, _ in cells:  # and so every cell's prediction is its measurement
        assert tune.predict_speedup(fitted, acc, 7) == pytest.approx(tune.predict_speedup(truth, acc, 7), rel=1e-9)
    # the p 0 cells alone are what s is fitted on; over every cell (version 1) the p-min time lands on s
    assert tune.fit_s(start, cells) == pytest.approx(0.561)
    charged = tune.fit_s(start, [(replace_p(a, 0.0), ms) for a, ms in cells])
    assert charged > 1.8 * 0.561  # nearly twice


def replace_p(acc: Acceptance, p: float) -> Acceptance:
    return Acceptance(acc.category, acc.budget, p, acc.counters, acc.tokens, acc.requests)


def test_the_committed_h200_tuning_refitted():
    """study/results/h200/real/tune: tune's cells of the real smollm2-135m pair on the H200 (an earlier draft; every
    p 0.3 / 0.6 cell with the same counters as p 0 in math). Its version 1 fit put s at 0.50 ms over every cell;
    on the p 0 cells s is 0.32 ms, and the p-min terms are its cells' own (p 0.6: +0.069 ms a block position,
    +0.55 ms a round at k 7; p 0.3: none to speak of)."""
    from dsparkcli.bench import tuning

    src = REPO / "study/results/h200/real/tune"
    rec = TuningRecord.from_record(json.loads((src / "tune.json").read_text()))
    assert rec.version == 1 and not rec.current and rec.cost.s_ms == pytest.approx(0.4992, abs=1e-4)
    cost = tuning.refit(rec, src / "tune.jsonl")
    assert (cost.t1_ms, cost.t_step_ms) == (rec.cost.t1_ms, rec.cost.t_step_ms)
    assert cost.s_ms == pytest.approx(0.31710, abs=1e-5)
    assert dict(cost.p_min_ms) == pytest.approx({0.3: -0.00663, 0.6: 0.06852}, abs=1e-5)
    assert cost.p_min_extra(0.6, 7) == pytest.approx(0.548, abs=1e-3)


def test_misses_name_the_cells_more_than_ten_per_cent_off():
    preds = [
        Prediction("code", Candidate(3, 0.0), 1.20, 3.0),
        Prediction("code", Candidate(5, 0.6), 1.10, 3.5),
        Prediction("all", Candidate(3, 0.0), 1.00, 2.0),
    ]
    verified = [("code", "k=3", 1.09), ("code", "k=5,p=0.6", 0.88), ("all", "k=3", 1.05), ("code", "adaptive", 1.3)]
    got = tune.misses(preds, verified)
    assert [(m.category, m.label) for m in got] == [("code", "k=5,p=0.6")]  # -20 %; -9.2 % and +5 % are within
    assert got[0].error == pytest.approx(0.88 / 1.10 - 1)
    assert [m.label for m in tune.misses(preds, verified, 0.06)] == ["k=5,p=0.6", "k=3"]


def _tuned(categories, choices, created="2026-12-01T00:00:00+00:00") -> TuningRecord:
    key = TuningKey("a" * 64, "b" * 64, "abc", "cpu", "none", (("np", "1"),))
    accs = tuple(_acc([90, 60, 30, 10], 100, category=c) for c in categories)
    return TuningRecord(
        key=key,
        cost=H200,
        acceptance=accs,
        predictions=tuple(tune.predict_all(H200, accs, [1, 2, 3])),
        choices=tuple(Choice(c, Candidate(b, 0.0) if b else None, None, 1.2 if b else 1.0) for c, b in choices),
        verified=tuple((c, f"k={b}", 1.2) for c, b in choices if b),
        budgets=(1, 2, 3),
        created=created,
        overall_of=tuple(categories),
    )


def test_a_second_categorys_tuning_keeps_the_first(tmp_path, monkeypatch):
    """tune --category math, then --category code: the store keeps math's pick (issue 28 item 11); the overall
    pick is the one pooled over more categories; tuning math again replaces math."""
    from dsparkcli.budget import store

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    everything = _tuned(["math", "code", "general"], [("math", 3), ("code", 2), ("general", None), ("all", 2)])
    math = _tuned(["math"], [("math", 1), ("all", 1)])
    code = _tuned(["code"], [("code", 3), ("all", 3)])
    store.save(math)
    stored = store.save(code)
    assert {c.category: c.candidate.budget for c in stored.choices} == {"math": 1, "code": 3, "all": 3}
    assert store.find(code.key) == stored and [a.category for a in stored.acceptance] == ["math", "code"]
    assert {v[0] for v in stored.verified} == {"math", "code", "all"}
    store.save(everything)  # all three: replaces both, and its overall
    assert {c.category: c.candidate and c.candidate.budget for c in store.find(code.key).choices} == {
        "math": 3,
        "code": 2,
        "general": None,
        "all": 2,
    }
    stored = store.save(code)  # code alone again: math, general and the overall of all three stay
    assert {c.category: c.candidate and c.candidate.budget for c in stored.choices} == {
        "math": 3,
        "general": None,
        "code": 3,
        "all": 2,
    }
    assert stored.overall_of == ("math", "code", "general")
    assert [p for p in stored.predictions if p.category == "all"] == [
        p for p in everything.predictions if p.category == "all"
    ]


def test_a_tuning_of_another_acceptance_replaces_rather_than_joins(tmp_path, monkeypatch):
    """A SYNTHETIC tuning (llama.cpp's emulated acceptance, e.g. study/tune_study.py) and a REAL one of the same
    key measure different workloads: the later replaces the earlier, categories and all."""
    from dataclasses import replace

    from dsparkcli.budget import store

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    store.save(replace(_tuned(["synthetic"], [("synthetic", 3), ("all", 3)]), synthetic=True, synth_len=4.0))
    real = _tuned(["code"], [("code", 2), ("all", 2)])
    assert store.save(real) == real and store.find(real.key).categories == ["code", "all"]
