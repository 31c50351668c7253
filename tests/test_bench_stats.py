"""Statistics of `dspark bench` on hand-made records: every expected value is worked out by hand."""

from __future__ import annotations

import pytest

from dsparkcli.bench import stats
from dsparkcli.bench.plan import BenchPlan, Draft, _label, _split_label
from dsparkcli.cli.bench import expand_multi_values
from dsparkcli.llama.protocol import SpecCounters, mean_acceptance_length


def req(config, category, prompt_id, rep, n, ms, tokens=None, first_div=None, draft=None, budget=None, sha="h"):
    rec = {
        "record": "request",
        "config": config,
        "draft": draft,
        "budget": budget,
        "category": category,
        "prompt_id": prompt_id,
        "rep": rep,
        "n_predicted": n,
        "predicted_ms": ms,
        "synthetic": False,
        "tokens": tokens or [],
        "output_sha256": sha,
    }
    if config != "plain":
        rec.update({"identical_to_plain": first_div is None, "first_divergence": first_div, "plain_sha256": "h"})
    return rec


def ctr(config, category, rep, drafted, accepted, steps, per_pos):
    return {
        "record": "counters",
        "config": config,
        "category": category,
        "rep": rep,
        "drafted": drafted,
        "accepted": accepted,
        "steps": steps,
        "accepted_per_pos": per_pos,
    }


def test_spread_median_min_max():
    assert stats.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert stats.spread([4.0, 1.0, 2.0, 10.0]) == {"median": 3.0, "min": 1.0, "max": 10.0}
    assert stats.spread([]) == {"median": None, "min": None, "max": None}


def test_speedup_and_mean_length():
    assert stats.speedup(150.0, 100.0) == 1.5
    assert stats.speedup(None, 100.0) is None and stats.speedup(10.0, 0.0) is None
    assert mean_acceptance_length(30, 10) == 4.0  # 1 + accepted / steps
    assert mean_acceptance_length(0, 5) == 1.0
    assert mean_acceptance_length(0, 0) is None


@pytest.mark.parametrize(
    "ref,other,expected",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [7, 2, 3], 0),
        ([1, 2, 3], [1, 2], 2),  # a prefix diverges where it ends
        ([1, 2], [1, 2, 3], 2),
        ([], [], None),
    ],
)
def test_first_divergence(ref, other, expected):
    assert stats.first_divergence(ref, other) == expected


def test_hashes_tell_outputs_apart():
    assert stats.tokens_sha256([1, 2, 3]) != stats.tokens_sha256([1, 23])  # separators matter
    assert stats.text_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_parse_counters_and_delta():
    before = SpecCounters.from_metrics(
        {
            "llamacpp:spec_decode_num_draft_tokens_total": 10.0,
            "llamacpp:spec_decode_num_accepted_tokens_total": 6.0,
            "llamacpp:spec_decode_num_drafts_total": 4.0,
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 4.0,
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 2.0,
        }
    )
    assert before.to_record() == {"drafted": 10, "accepted": 6, "steps": 4, "accepted_per_pos": [4, 2]}
    after = SpecCounters.from_record({"drafted": 25, "accepted": 17, "steps": 9, "accepted_per_pos": [9, 6, 2]})
    assert after.minus(before).to_record() == {
        "drafted": 15,
        "accepted": 11,
        "steps": 5,
        "accepted_per_pos": [5, 4, 2],
    }
    # nothing speculative yet: every counter reads 0 and the per-position list is empty
    assert SpecCounters.from_metrics({"llamacpp:tokens_predicted_total": 5.0}).to_record() == {
        "drafted": 0,
        "accepted": 0,
        "steps": 0,
        "accepted_per_pos": [],
    }


@pytest.fixture
def records():
    """Plain and one draft config, categories code (prompts c1, c2) and ocr (o1), two reps.

    tok/s per rep = Σ tokens / Σ ms:
      plain code: rep0 (100+100)/(1000+1000) = 100/s, rep1 (100+100)/(500+500) = 200/s  -> median 150
      plain ocr : rep0 50/500 = 100/s, rep1 50/250 = 200/s                                -> median 150
      d@5 code  : rep0 200/500 = 400/s, rep1 200/400 = 500/s                              -> median 450
      d@5 ocr   : rep0 50/250 = 200/s, rep1 50/100 = 500/s                                -> median 350
      all plain : rep0 250/2500 = 100/s, rep1 250/1250 = 200/s                            -> median 150
      all d@5   : rep0 250/750 = 333.3/s, rep1 250/500 = 500/s                            -> median 416.7
    """
    recs = [
        req("plain", "code", "c1", 0, 100, 1000.0),
        req("plain", "code", "c2", 0, 100, 1000.0),
        req("plain", "ocr", "o1", 0, 50, 500.0),
        req("plain", "code", "c1", 1, 100, 500.0),
        req("plain", "code", "c2", 1, 100, 500.0),
        req("plain", "ocr", "o1", 1, 50, 250.0),
    ]
    d = {"draft": "d", "budget": 5}
    recs += [
        req("d@5", "code", "c1", 0, 100, 250.0, **d),
        req("d@5", "code", "c2", 0, 100, 250.0, first_div=17, sha="x", **d),
        req("d@5", "ocr", "o1", 0, 50, 250.0, **d),
        req("d@5", "code", "c1", 1, 100, 200.0, **d),
        req("d@5", "code", "c2", 1, 100, 200.0, first_div=12, sha="y", **d),
        req("d@5", "ocr", "o1", 1, 50, 100.0, **d),
        ctr("d@5", "code", 0, 100, 60, 20, [18, 15, 12, 9, 6]),
        ctr("d@5", "ocr", 0, 40, 10, 10, [6, 3, 1, 0, 0]),
        ctr("d@5", "code", 1, 100, 60, 20, [18, 15, 12, 9, 6]),
        ctr("d@5", "ocr", 1, 40, 10, 10, [6, 3, 1]),
    ]
    return recs


def test_summarize_by_hand(records):
    rows = {(r.config, r.category): r.to_record() for r in stats.summarize(records, {"code": 7.387, "ocr": 5.407})}
    assert list(rows) == [
        ("plain", "code"),
        ("plain", "ocr"),
        ("plain", "all"),
        ("d@5", "code"),
        ("d@5", "ocr"),
        ("d@5", "all"),
    ]
    assert rows[("plain", "code")]["tok_s"] == {"median": 150.0, "min": 100.0, "max": 200.0}
    assert rows[("plain", "code")]["speedup"] == 1.0
    assert rows[("plain", "code")]["upstream_acceptance_length"] == 7.387
    assert "drafted" not in rows[("plain", "code")]

    code = rows[("d@5", "code")]
    assert code["tok_s"] == {"median": 450.0, "min": 400.0, "max": 500.0}
    assert code["speedup"] == 3.0  # 450 / 150, plain from the same records
    assert (code["drafted"], code["accepted"], code["steps"]) == (200, 120, 40)
    assert code["acceptance_rate"] == 0.6
    assert code["mean_length"] == 4.0  # 1 + 120 / 40
    assert code["accepted_per_pos"] == [36, 30, 24, 18, 12]
    assert code["acceptance_per_pos"] == [0.9, 0.75, 0.6, 0.45, 0.3]
    assert (code["identical"], code["prompts"], code["identical_pct"]) == (1, 2, 50.0)
    assert code["divergent"] == [
        {"prompt_id": "c2", "first_divergence": 12, "output_sha256": "y", "plain_sha256": "h"}
    ]
    assert (code["prompts"], code["reps"], code["requests"], code["tokens"]) == (2, 2, 4, 400)
    assert code["upstream_acceptance_length"] == 7.387

    ocr = rows[("d@5", "ocr")]
    assert ocr["tok_s"] == {"median": 350.0, "min": 200.0, "max": 500.0}
    assert ocr["speedup"] == 350.0 / 150.0
    assert ocr["mean_length"] == 2.0 and ocr["accepted_per_pos"] == [12, 6, 2, 0, 0]
    assert ocr["identical"] == 1 and ocr["divergent"] == []

    total = rows[("d@5", "all")]
    assert total["tok_s"]["median"] == pytest.approx((250 / 0.75 + 500.0) / 2)
    assert total["speedup"] == pytest.approx(total["tok_s"]["median"] / 150.0)
    assert (total["drafted"], total["accepted"], total["steps"]) == (280, 140, 60)
    assert total["mean_length"] == 1 + 140 / 60
    assert total["upstream_acceptance_length"] is None
    assert (total["identical"], total["prompts"]) == (2, 3)

    typed = {(r.config, r.category): r for r in stats.summarize(records)}  # what the report and tune read
    assert typed[("plain", "code")].drafting is None and typed[("plain", "code")].tok_s.median == 150.0
    d = typed[("d@5", "all")].drafting
    assert d is not None and (d.total.drafted, d.total.accepted, d.counters.steps) == (280, 140, 60)
    assert [v.prompt_id for v in d.divergent] == ["c2"] and d.identical_pct == pytest.approx(200 / 3)


def test_summarize_ignores_other_records_and_is_deterministic(records):
    noise = [
        {"record": "prompt", "prompt_id": "c1"},
        {"record": "summary", "config": "plain"},
        {"record": "overhead", "ratio": 1.0},
    ]
    assert stats.summarize(records + noise) == stats.summarize(list(records))


def test_validate_rejects_bad_plans(tmp_path):
    from dsparkcli.bench.prompts import Prompt
    from dsparkcli.errors import UsageError

    p = Prompt("a", "math", "hi")
    img = Prompt("b", "ocr", "read", images=(tmp_path / "x.png",))
    base = dict(target=tmp_path / "t.gguf", drafts=(Draft("d", tmp_path / "d.gguf"),), budgets=(5,), prompts=(p,))
    BenchPlan(**base).validate()
    for change, message in [
        ({"budgets": ()}, "at least one --budget"),
        ({"budgets": (0, 5)}, "must be >= 1"),
        ({"budgets": (5, 5)}, "distinct"),
        ({"drafts": ()}, "at least one draft"),
        ({"reps": 0}, "--reps"),
        ({"p_min": 1.5}, "--p-min"),
        ({"synth_len": 7.0, "budgets": (5, 15)}, r"--synth-len must be within \[1, 6\]"),
        ({"prompts": (p, img)}, "1 prompts have images"),
        ({"drafts": (Draft("d", tmp_path / "a"), Draft("d", tmp_path / "b"))}, "share the label"),
    ]:
        with pytest.raises(UsageError, match=message):
            BenchPlan(**{**base, **change}).validate()


def test_arms_are_plain_then_every_draft_by_budget(tmp_path):
    plan = BenchPlan(
        target=tmp_path / "t",
        drafts=(Draft("q8", tmp_path / "a"), Draft("q6", tmp_path / "b")),
        budgets=(5, 15),
        prompts=(),
        reps=3,
        warmup=1,
    )
    assert [a.name for a in plan.arms()] == ["plain", "q8@5", "q8@15", "q6@5", "q6@15"]
    assert plan.total_requests() == 5 * 1


def test_budget_takes_several_values():
    assert expand_multi_values(["--budget", "5", "15", "--reps", "3"], ("--budget", "-b")) == [
        "--budget",
        "5",
        "--budget",
        "15",
        "--reps",
        "3",
    ]
    assert expand_multi_values(["-b", "7", "--draft", "d.gguf"], ("--budget", "-b")) == [
        "-b",
        "7",
        "--draft",
        "d.gguf",
    ]
    assert expand_multi_values(["--budget", "5", "--budget", "9"], ("--budget",)) == ["--budget", "5", "--budget", "9"]


def test_cli_errors_are_one_line(cli, tmp_path):
    t = tmp_path / "t.gguf"
    t.write_bytes(b"GGUF")
    for args, code, text in [
        (["--format", "xml"], 2, "--format must be one of table, json, csv, md"),
        (["--plot", str(tmp_path / "p.jpg")], 2, "--plot writes a PNG"),
        (["--prompts", str(tmp_path / "none.jsonl")], 2, "prompt file not found"),
        (["--category", "poetry"], 2, "no prompts in category poetry"),
    ]:
        proc = cli("bench", "--target", str(t), "--draft", str(t), *args)
        assert proc.returncode == code, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(f"dspark: error: {text}"), proc.stderr
        assert "Traceback" not in proc.stderr


def test_help_has_examples(cli):
    proc = cli("bench", "--help")
    assert proc.returncode == 0
    assert "  Examples:\n    dspark bench --budget 5 15 " in proc.stdout


def test_draft_labels():
    assert _split_label("q8=/models/d.gguf") == ("q8", "/models/d.gguf")
    assert _split_label("/models/a=b/d.gguf") == (None, "/models/a=b/d.gguf")
    assert _split_label("hf://org/repo/d.gguf") == (None, "hf://org/repo/d.gguf")
    assert _split_label("q8_0") == (None, "q8_0")
    taken = {"d"}
    assert _label("/x/d.gguf", taken) == "d-2"
    assert _label("/x/other.gguf", taken) == "other"


def test_an_interrupted_block_counts_the_drafts_its_requests_hold():
    """issue 28 item 2: Ctrl-C inside a (rep, category) block leaves requests that /metrics was never read
    after; their drafted / accepted come from their own timings (the table said "drafted 0"), while steps,
    mean length and per-position shares stay those of the blocks /metrics covered."""
    d = {"draft": "d", "budget": 5}

    def drafted(rec, n, accepted):
        return {**rec, "draft_n": n, "draft_n_accepted": accepted}

    recs = [
        req("plain", "code", "c1", 0, 100, 1000.0),
        req("plain", "code", "c2", 0, 100, 1000.0),
        drafted(req("d@5", "code", "c1", 0, 100, 250.0, **d), 60, 40),
        drafted(req("d@5", "code", "c2", 0, 100, 250.0, **d), 40, 20),
        ctr("d@5", "code", 0, 100, 60, 20, [18, 15, 12, 9, 6]),
        # rep 1 interrupted after c1: no counters record for its block
        drafted(req("d@5", "code", "c1", 1, 100, 250.0, **d), 27, 19),
        # a second draft configuration that had not finished one block
        drafted(req("e@3", "code", "c1", 0, 100, 300.0, draft="e", budget=3), 27, 19),
        drafted(req("e@3", "code", "c2", 0, 100, 300.0, draft="e", budget=3), 11, 5),
    ]
    rows = {(r.config, r.category): r.to_record() for r in stats.summarize(recs)}
    for cat in ("code", "all"):
        row = rows[("d@5", cat)]
        assert (row["drafted"], row["accepted"], row["steps"]) == (127, 79, 20)
        assert row["acceptance_rate"] == 79 / 127
        assert row["mean_length"] == 4.0 and row["acceptance_per_pos"] == [0.9, 0.75, 0.6, 0.45, 0.3]
        assert (row["uncounted_requests"], row["uncounted_drafted"], row["uncounted_accepted"]) == (1, 27, 19)
        assert (row["timings_drafted"], row["timings_accepted"]) == (127, 79)
    e = rows[("e@3", "all")]
    assert (e["drafted"], e["accepted"], e["steps"], e["mean_length"]) == (38, 24, 0, None)
    assert e["acceptance_rate"] == 24 / 38
    from dsparkcli.bench.summaries import SummaryRecord  # the JSONL row reads back to the same figures

    for row in rows.values():
        assert SummaryRecord.from_record(row).to_record() == {k: v for k, v in row.items() if k != "load_s"}
    # a finished run's rows carry no uncounted figures
    done = {(r.config, r.category): r.to_record() for r in stats.summarize(recs[:5])}
    assert "uncounted_requests" not in done[("d@5", "all")] and done[("d@5", "all")]["drafted"] == 100
