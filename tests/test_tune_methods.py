"""tune --methods (issue 35): tune measures speculation methods (plain, the DSpark pick, n-gram types, chains)
in its verification run and picks one per category (the simpler within 2 %); ``--budget auto`` in run and
serve then runs the pick and says so in one line; bench's --budget auto stays a budget. Pure parts exactly;
the tune on a known-answer pair with the real binaries (-t 1)."""

from __future__ import annotations

import json

import pytest

from dsparkcli.budget import methods, store
from dsparkcli.budget.choice import Want, chosen_server
from dsparkcli.budget.model import OVERALL, Candidate, Choice, CostModel
from dsparkcli.budget.record import TuningRecord, merged
from dsparkcli.errors import UsageError
from dsparkcli.llama.server import ServerConfig
from dsparkcli.synth import known_answer as synth


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))  # the tuning store, per test


def test_methods_parse_to_labels_with_one_line_refusals() -> None:
    assert methods.parse_methods(None) == ("plain", "dspark", "ngram-mod", "ngram-mod+dspark")
    assert methods.parse_methods(["Plain", "ngram-mod:n_max=8+dspark"]) == ("plain", "ngram-mod:n_max=8+dspark")
    for given, line in (
        (["plain", "plain"], "--methods 'plain': plain given twice"),
        (["ngram-mod+dspark", "ngram-mod+dspark"], "--methods 'ngram-mod+dspark': ngram-mod+dspark given twice"),
        (["draft-simple"], "--methods 'draft-simple': tune measures the pair's own DSpark draft, not a classic one"),
        (
            ["eagle"],
            "--spec 'eagle': unknown speculation 'eagle' (known: dspark, ngram-mod, ngram-simple, draft-simple)",
        ),
    ):
        with pytest.raises(UsageError) as e:
            methods.parse_methods(given)
        assert str(e.value) == line
    assert methods.speculation_of("plain") is None and methods.speculation_of("dspark") is None
    chain = methods.speculation_of("ngram-mod:n_max=8+dspark@3")
    assert chain is not None and (chain.spec_type, methods.budget_of("ngram-mod:n_max=8+dspark@3")) == (
        "ngram-mod,draft-dspark",
        3,
    )
    assert methods.budget_of("ngram-mod") is None


def test_the_pick_is_the_simplest_within_two_percent_of_the_fastest() -> None:
    assert methods.pick([("plain", 1.0), ("dspark", 1.5), ("ngram-mod+dspark@3", 1.52)]) == ("dspark", 1.5)
    assert methods.pick([("plain", 1.0), ("dspark", 1.5), ("ngram-mod+dspark@3", 1.54)]) == (
        "ngram-mod+dspark@3",
        1.54,
    )
    assert methods.pick([("plain", 1.0), ("ngram-mod", 1.01)]) == ("plain", 1.0)
    assert methods.pick([]) is None
    choices = [
        Choice("code", Candidate(3, 0.0), predicted=1.4, measured=1.3),
        Choice("math", None, predicted=None, measured=None),  # plain won the budgets: no dspark row
        Choice(OVERALL, Candidate(3, 0.0), predicted=1.2, measured=None),  # not verified: the prediction
    ]
    measured = [("code", "ngram-mod", 0.98), ("code", "ngram-mod+dspark@3", 1.6), ("math", "ngram-mod", 1.25)]
    measured += [(OVERALL, "ngram-mod", 1.1), (OVERALL, "ngram-mod+dspark@3", 1.21)]
    rows, chosen = methods.picks(("plain", "dspark", "ngram-mod", "ngram-mod+dspark"), choices, measured)
    assert chosen == (("code", "ngram-mod+dspark@3"), ("math", "ngram-mod"), (OVERALL, "dspark"))
    assert rows == (
        ("code", "plain", 1.0),
        ("code", "dspark", 1.3),
        ("code", "ngram-mod", 0.98),
        ("code", "ngram-mod+dspark@3", 1.6),
        ("math", "plain", 1.0),
        ("math", "ngram-mod", 1.25),
        (OVERALL, "plain", 1.0),
        (OVERALL, "dspark", 1.2),
        (OVERALL, "ngram-mod", 1.1),
        (OVERALL, "ngram-mod+dspark@3", 1.21),
    )


def _record(key, method_choices=(), rows=()) -> TuningRecord:
    return TuningRecord(
        key=key,
        cost=CostModel(10.0, ((3, 12.0),)),
        acceptance=(),
        predictions=(),
        choices=(Choice("code", Candidate(3, 0.0), 1.4, 1.3), Choice(OVERALL, Candidate(3, 0.0), 1.4, 1.3)),
        verified=(("code", "3", 1.3), (OVERALL, "3", 1.3)),
        budgets=(3,),
        method_choices=tuple(method_choices),
        methods=tuple(rows),
    )


def test_a_record_carries_its_methods_only_when_it_measured_them(engine, tmp_path) -> None:
    pair = synth.write_pair(tmp_path / "p")
    key = store.key_for(engine, ServerConfig(model=pair.target, draft=pair.draft))
    rows = [("code", "plain", 1.0), ("code", "ngram-mod", 1.5), (OVERALL, "plain", 1.0), (OVERALL, "dspark", 1.3)]
    rec = _record(key, [("code", "ngram-mod"), (OVERALL, "dspark")], rows)
    back = TuningRecord.from_record(json.loads(json.dumps(rec.to_record())))
    assert back == rec and back.method_choice("code") == "ngram-mod" and back.method_choice() == "dspark"
    assert "methods" not in _record(key).to_record() and _record(key).method_choice() is None
    # a later tune of another category keeps this one's method pick
    other = TuningRecord(
        **{**_record(key).__dict__, "choices": (Choice("math", None, None, None),), "verified": ()},
    )
    other = TuningRecord(
        **{**other.__dict__, "method_choices": (("math", "plain"),), "methods": (("math", "plain", 1.0),)}
    )
    assert set(merged(rec, other).method_choices) == {("code", "ngram-mod"), ("math", "plain"), (OVERALL, "dspark")}


@pytest.mark.parametrize(
    ("pick", "spec_type", "drafts", "n_max", "line"),
    [
        (
            "ngram-mod",
            "ngram-mod",
            False,
            None,
            "method ngram-mod (1.50x plain, the fastest of plain 1.00x, dspark 1.30x, ngram-mod+dspark@3 1.20x): the DSpark draft is not loaded",
        ),
        (
            "ngram-mod+dspark@3",
            "ngram-mod,draft-dspark",
            True,
            3,
            "method ngram-mod+dspark@3 (1.20x plain, the fastest of plain 1.00x, dspark 1.30x, ngram-mod 1.50x)",
        ),
        (
            "plain",
            None,
            False,
            None,
            "method plain (1.00x plain, the fastest of dspark 1.30x, ngram-mod 1.50x, ngram-mod+dspark@3 1.20x), so the draft is not loaded",
        ),
        ("dspark", None, True, 3, "budget 3 (1.30x plain)"),
    ],
)
def test_budget_auto_runs_the_tunings_method(engine, tmp_path, pick, spec_type, drafts, n_max, line) -> None:
    pair = synth.write_pair(tmp_path / "p")
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=5, threads=1)
    key = store.key_for(engine, cfg)
    names = ("plain", "dspark", "ngram-mod", "ngram-mod+dspark@3")
    rows = [("code", m, x) for m, x in zip(names, (1.0, 1.3, 1.5, 1.2))]
    store.save(_record(key, [("code", pick)], rows))
    got, choice = chosen_server(engine, cfg, Want(budget=True, category="code"))
    assert choice is not None and choice.message.startswith(f"tuning {key.id} for category code: {line}")
    assert (got.spec_type, got.draft is not None, got.n_max) == (spec_type, drafts, n_max)
    # bench measures what it is asked: its --budget auto is the DSpark budget whatever the method pick
    bench_cfg, bench_choice = chosen_server(engine, cfg, Want(budget=True, category="code", methods=False))
    assert (bench_cfg.spec_type, bench_cfg.n_max) == (None, 3)
    assert (
        bench_choice is not None
        and bench_choice.message == f"tuning {key.id} for category code: budget 3 (1.30x plain)"
    )


def test_budget_auto_runs_an_ngram_pick_where_plain_won_the_dspark_budgets(engine, tmp_path) -> None:
    """A loaded machine measured every DSpark budget no faster than plain, and ngram-mod 1.30x: --budget auto
    runs ngram-mod (it ran plain, the DSpark choice's answer, until the method pick came first); bench, which
    takes the DSpark choice alone, still runs without the draft."""
    pair = synth.write_pair(tmp_path / "p")
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=5, threads=1)
    key = store.key_for(engine, cfg)
    rows = [(c, m, x) for c in ("code", OVERALL) for m, x in (("plain", 1.0), ("ngram-mod", 1.3))]
    plain_won = (Choice("code", None, None, 1.0), Choice(OVERALL, None, None, 1.0))
    rec = _record(key, [("code", "ngram-mod"), (OVERALL, "ngram-mod")], rows)
    store.save(TuningRecord(**{**rec.__dict__, "choices": plain_won, "verified": ()}))
    got, choice = chosen_server(engine, cfg, Want(budget=True))
    assert choice is not None and choice.message == (
        f"tuning {key.id}: method ngram-mod (1.30x plain, the fastest of plain 1.00x): the DSpark draft is not loaded"
    )
    assert (got.spec_type, got.draft, got.n_max) == ("ngram-mod", None, None)
    bench_cfg, bench_choice = chosen_server(engine, cfg, Want(budget=True, methods=False))
    assert bench_choice is not None and bench_choice.without_draft and bench_cfg.draft is None
    assert bench_cfg.spec_type is None


def test_budget_auto_says_plain_won_where_plain_won_the_budgets_and_the_methods(engine, tmp_path) -> None:
    """--methods plain dspark on a machine where no budget beat plain: the method pick is plain, and the line is
    the DSpark choice's own ("plain decoding beat every budget"), not "method plain (... the fastest of )"."""
    pair = synth.write_pair(tmp_path / "p")
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=5, threads=1)
    key = store.key_for(engine, cfg)
    rec = _record(key, [(OVERALL, "plain")], [(OVERALL, "plain", 1.0)])
    store.save(TuningRecord(**{**rec.__dict__, "choices": (Choice(OVERALL, None, None, 1.0),), "verified": ()}))
    got, choice = chosen_server(engine, cfg, Want(budget=True))
    assert choice is not None and choice.message.startswith(f"tuning {key.id}: plain decoding beat every budget, ")
    assert choice.without_draft and got.draft is None and got.spec_type is None


def test_tune_measures_the_methods_and_run_budget_auto_runs_the_pick(engine, cli, tmp_path) -> None:
    """A known-answer pair whose greedy answer cycles: n-gram lookup copies it, DSpark is always right."""
    from support.cli import run_cli

    pair = synth.write_pair(tmp_path / "pair", accept_rate=1.0, seed=7, target_layers=24)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a1", "category": "alpha", "prompt": "hello"}) + "\n")
    env = {"DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp_path / "cache")}
    ngram = "ngram-mod:n_max=8,n_min=2"
    files = ("--target", str(pair.target), "--draft", str(pair.draft))
    proc = run_cli(
        "tune",
        *files,
        "--prompts",
        str(prompts),
        "--budgets",
        "2",
        "--methods",
        "plain",
        "dspark",
        ngram,
        f"{ngram}+dspark",
        "-n",
        "160",
        "--threads",
        "1",
        "--ctx",
        "1024",
        "--json",
        "--out",
        str(tmp_path / "t.jsonl"),
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = [(m["category"], m["method"], m["speedup"]) for m in doc["methods"]]
    chain = f"{ngram}+dspark@2"  # at the overall pick, the only budget
    for cat in ("alpha", OVERALL):
        measured = [(m, x) for c, m, x in rows if c == cat]
        # dspark is a row where DSpark won the budgets (on a loaded machine plain may, now and then)
        budget = next(c["budget"] for c in doc["choices"] if c["category"] == cat)
        assert [m for m, _ in measured] == ["plain", *(["dspark"] if budget else []), ngram, chain]
        assert measured[0] == ("plain", 1.0)
        assert {"category": cat, "method": methods.pick(measured)[0]} in doc["method_choices"]  # type: ignore[index]
    verify = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    blocks = [r for r in verify if r["record"] == "counters" and r["config"] == chain]
    assert blocks and all(sum(t["drafted"] for t in b["by_type"]) == b["drafted"] for b in blocks)
    pick = next(m["method"] for m in doc["method_choices"] if m["category"] == OVERALL)
    proc = cli(
        "run", *files, "hello", "-n", "8", "--json", "--budget", "auto", "--threads", "1", "--ctx", "1024", env=env
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["server_argv"]
    spec_type = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else None
    expected = {"plain": None, "dspark": "draft-dspark", ngram: "ngram-mod", chain: "ngram-mod,draft-dspark"}[pick]
    assert spec_type == expected
    if pick not in ("dspark",):
        assert f"tuning {doc['key_id']}: method {pick} (" in proc.stderr


def test_tunes_overall_line_says_what_budget_auto_runs(engine, tmp_path) -> None:
    """The one line tune ends with names what run and serve --budget auto will run overall: the method pick
    where one other than the DSpark draft won (it said "nothing beat plain" while ngram-mod had, 1.30x)."""
    from dsparkcli.cli.tune import overall_line

    pair = synth.write_pair(tmp_path / "p")
    key = store.key_for(engine, ServerConfig(model=pair.target, draft=pair.draft, n_max=5, threads=1))
    rows = [
        (OVERALL, m, x) for m, x in (("plain", 1.0), ("dspark", 1.3), ("ngram-mod", 1.5), ("ngram-mod+dspark@3", 1.4))
    ]
    plain_won = {"choices": (Choice(OVERALL, None, None, 1.0),), "verified": ()}
    cases = [
        ((), {}, "overall choice: budget 3; use it with --budget auto"),  # no methods measured: the DSpark pick
        ([(OVERALL, "dspark")], {}, "overall choice: budget 3; use it with --budget auto"),
        (
            [(OVERALL, "ngram-mod")],
            {},
            "overall choice: ngram-mod (1.50x plain); --budget auto runs it, without the DSpark draft",
        ),
        (
            [(OVERALL, "ngram-mod")],
            plain_won,
            "overall choice: ngram-mod (1.50x plain); --budget auto runs it, without the DSpark draft",
        ),
        (
            [(OVERALL, "ngram-mod+dspark@3")],
            {},
            "overall choice: ngram-mod+dspark@3 (1.40x plain); --budget auto runs it",
        ),
        (
            [(OVERALL, "plain")],
            plain_won,
            "nothing beat plain decoding on this machine and workload: --budget auto runs without the draft",
        ),
        (
            (),
            plain_won,
            "nothing beat plain decoding on this machine and workload: --budget auto runs without the draft",
        ),
    ]
    for picks, changes, line in cases:
        rec = _record(key, picks, rows if picks else ())
        assert overall_line(TuningRecord(**{**rec.__dict__, **changes})) == line, (picks, changes)
