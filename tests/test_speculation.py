"""--spec (issue 34): llama.cpp's n-gram speculation and a classic draft model (draft-simple) as bench
configurations beside plain and the DSpark drafts, and as run's / serve's choice: parsing and its one-line
refusals, the llama-server flags it owns, the plan's arms and their servers, the classic draft's pairing
check (the tokenizer comparison DSpark drafts get)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import PLAIN
from dsparkcli.errors import PairingError, UsageError
from dsparkcli.gguf.pairing import check_classic_pair
from dsparkcli.llama.server import ServerConfig
from dsparkcli.llama.speculation import parse
from dsparkcli.pairs import classic_draft
from dsparkcli.synth import known_answer as synth


def test_spec_texts_become_labels_and_llama_server_flags() -> None:
    assert parse("dspark") is None
    mod = parse("ngram-mod:n_max=8,n_min=4")
    assert (mod.kind, mod.label, mod.flags()) == (
        "ngram-mod",
        "ngram-mod:n_max=8,n_min=4",
        (("--spec-ngram-mod-n-max", 8), ("--spec-ngram-mod-n-min", 4)),
    )
    simple = parse("ngram-simple:n_max=16,size_n=4")
    assert simple.flags() == (("--spec-ngram-simple-size-m", 16), ("--spec-ngram-simple-size-n", 4))
    assert parse("ngram-mod").flags() == () and parse("ngram-mod").label == "ngram-mod"
    classic = parse("draft-simple:qwen2.5-coder-0.5b")
    assert (classic.uses_model, classic.model, classic.label) == (
        True,
        "qwen2.5-coder-0.5b",
        "draft-simple:qwen2.5-coder-0.5b",
    )
    assert parse("draft-simple:/models/small.gguf").label == "draft-simple:small"
    assert parse("draft-simple").model is None


@pytest.mark.parametrize(
    "text, why",
    [
        ("medusa", "unknown speculation 'medusa' (known: dspark, ngram-mod, ngram-simple, draft-simple)"),
        ("ngram-mod:n_max=2000", "n_max must be within [0, 1024] (got 2000)"),
        ("ngram-mod:size_n=3", "ngram-mod takes n_max=N, n_min=N, n_match=N (got 'size_n=3')"),
        ("ngram-mod:n_max=eight", "n_max must be an integer (got 'eight')"),
        ("ngram-mod:n_max=8,n_max=9", "n_max given twice"),
        ("ngram-simple:n_max=8", "ngram-simple drafts only when n_max >= size_n (n_max 8, size_n 12)"),
        ("dspark:3", "dspark takes no options (its budget is --budget)"),
        ("draft-simple:", "give the classic draft model after the colon, or nothing"),
    ],
)
def test_a_wrong_spec_is_refused_in_one_line(text, why) -> None:
    with pytest.raises(UsageError) as e:
        parse(text)
    assert str(e.value) == f"--spec {text!r}: {why}"


@pytest.mark.parametrize(
    "flag", ["--spec-type", "--spec-ngram-mod-n-max", "--spec-ngram-simple-size-m", "--spec-ngram-mod-n-match"]
)
def test_spec_flags_after_dashdash_are_refused(flag) -> None:
    with pytest.raises(
        UsageError, match=f"^{flag} after `--` would override what dspark checked and reports: use --spec"
    ):
        ServerConfig(model=Path("t.gguf"), extra_args=(flag, "8"))


def test_server_argv_of_ngram_and_draft_simple() -> None:
    s = parse("ngram-mod:n_max=8")
    cfg = ServerConfig(model=Path("t.gguf"), spec_type=s.kind, spec_flags=s.flags(), ctx=512)
    assert cfg.speculates
    assert cfg.argv(Path("llama-server"), 9)[9:] == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "8",
        "-c",
        "512",
        "--metrics",
    ]
    classic = ServerConfig(model=Path("t.gguf"), draft=Path("d.gguf"), spec_type="draft-simple", n_max=4)
    assert classic.argv(Path("llama-server"), 9)[9:] == [
        "-md",
        "d.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "4",
        "--metrics",
    ]
    assert cfg.without_draft() == ServerConfig(model=Path("t.gguf"), ctx=512) and not cfg.without_draft().speculates


def _plan(**kw) -> BenchPlan:
    prompts = (Prompt(id="c1", category="code", text="x"),)
    return BenchPlan(target=Path("t.gguf"), prompts=prompts, **{"drafts": (), "budgets": (), **kw})


def test_bench_arms_for_spec_beside_plain_and_dspark() -> None:
    classic = replace(parse("draft-simple:small"), path=Path("small.gguf"))
    plan = _plan(
        drafts=(Draft("q8", Path("d.gguf")),),
        budgets=(2, 4),
        specs=(parse("ngram-mod:n_max=8"), parse("ngram-simple"), classic),
    )
    plan.validate()
    arms = plan.arms()
    assert [a.name for a in arms] == [
        PLAIN,
        "q8@2",
        "q8@4",
        "ngram-mod:n_max=8",
        "ngram-simple",
        "draft-simple:small@2",
        "draft-simple:small@4",
    ]
    assert [a.plain for a in arms] == [True] + [False] * 6
    assert [a.draft_label for a in arms] == [
        None,
        "q8",
        "q8",
        "ngram-mod:n_max=8",
        "ngram-simple",
        "draft-simple:small",
        "draft-simple:small",
    ]
    ngram = plan.server_config(arms[3])
    assert (ngram.draft, ngram.spec_type, ngram.spec_flags, ngram.n_max) == (
        None,
        "ngram-mod",
        (("--spec-ngram-mod-n-max", 8),),
        None,
    )
    simple = plan.server_config(arms[5])
    assert (simple.draft, simple.spec_type, simple.n_max) == (Path("small.gguf"), "draft-simple", 2)
    dspark = plan.server_config(arms[1])
    assert (dspark.spec_type, dspark.argv(Path("s"), 1)[11:13]) == (None, ["--spec-type", "draft-dspark"])


def test_a_bench_of_ngram_alone_needs_no_budget_and_names_must_differ() -> None:
    _plan(specs=(parse("ngram-mod"),)).validate()
    with pytest.raises(UsageError, match="^bench needs at least one draft \\(--draft or --model\\) or --spec$"):
        _plan().validate()
    with pytest.raises(UsageError, match="^two configurations share the name 'ngram-mod'$"):
        _plan(specs=(parse("ngram-mod"), parse("ngram-mod"))).validate()
    assert Arm(PLAIN).plain and not Arm("n", spec=parse("ngram-mod")).plain


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """Text models of the known-answer kind: two with the same 128-token tokenizer, one with 256, a DSpark draft."""
    root = tmp_path_factory.mktemp("classic")
    a = synth.write_pair(root / "a", vocab=128, seed=1)
    b = synth.write_pair(root / "b", vocab=128, seed=2)
    c = synth.write_pair(root / "c", vocab=256, seed=3)
    return {"target": a.target, "same": b.target, "wider": c.target, "dspark": a.draft}


def test_classic_pairing_compares_the_tokenizers(targets) -> None:
    ok = check_classic_pair(targets["target"], targets["same"])
    assert ok.ok and [c.name for c in ok.checks] == ["target role", "draft role", "vocab", "BOS", "EOS"]
    wider = check_classic_pair(targets["target"], targets["wider"])
    assert not wider.ok and wider.reasons == ("vocab: target has 128 tokens, draft 256",)
    dspark = check_classic_pair(targets["target"], targets["dspark"])
    assert not dspark.ok and dspark.reasons[0].startswith("draft role: arch dflash is not a text model")


def test_classic_draft_refuses_another_tokenizer_in_one_line(targets) -> None:
    assert classic_draft(str(targets["same"]), targets["target"]) == (str(targets["same"]), targets["same"])
    with pytest.raises(PairingError) as e:
        classic_draft(str(targets["wider"]), targets["target"])
    assert str(e.value).startswith(
        f"classic draft {targets['wider']} does not fit target {targets['target']}: "
        "vocab: target has 128 tokens, draft 256"
    )
    with pytest.raises(
        UsageError, match="^--spec draft-simple: a local --target has no classic draft model; give one"
    ):
        classic_draft(None, targets["target"])


def test_bench_cli_refuses_a_classic_draft_of_another_family(cli, engine, targets) -> None:
    r = cli(
        "bench",
        "--target",
        str(targets["target"]),
        "--spec",
        f"draft-simple:{targets['wider']}",
        "--llama-bin",
        str(engine.bin_dir),
        "--reps",
        "1",
    )
    assert r.returncode != 0
    assert (
        r.stderr.strip()
        .splitlines()[0]
        .startswith(
            f"dspark: error: classic draft {targets['wider']} does not fit target {targets['target']}: "
            "vocab: target has 128 tokens, draft 256"
        )
    )
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--spec", "ngram-mod", "--budget", "3"],
            "dspark: error: --budget/--p-min set a draft model's draft; ngram-mod drafts at its own limits "
            "(--spec ngram-mod:n_max=N)",
        ),
        (
            ["--spec", "ngram-mod", "--no-draft"],
            "dspark: error: --no-draft and --spec ngram-mod: a DSpark draft's options; give one or the other",
        ),
        (
            ["--spec", "draft-simple", "--budget", "auto"],
            "dspark: error: --budget auto: a DSpark draft's tuning; --spec draft-simple:classic takes a number or none",
        ),
    ],
)
def test_run_refuses_dspark_options_with_another_spec(cli, engine, targets, args, line) -> None:
    r = cli("run", "--target", str(targets["target"]), *args, "--llama-bin", str(engine.bin_dir), "hello")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[0] == line


def test_run_spec_ngram_mod_drafts_past_the_old_cap(cli, engine, tmp_path) -> None:
    """dspark run --spec ngram-mod on a known-answer target: the answer repeats its 128-token cycle, so from
    the second cycle on every step drafts ngram-mod's own n_max (8), not the 3 the old patch 0001 allowed."""
    pair = synth.write_pair(tmp_path / "p", accept_rate=1.0, seed=7)
    r = cli(
        "run",
        "--target",
        str(pair.target),
        "--spec",
        "ngram-mod:n_max=8,n_min=2",
        "-n",
        "200",
        "-t",
        "1",
        "--json",
        "--llama-bin",
        str(engine.bin_dir),
        "hello",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    argv = d["server_argv"]
    i = argv.index("--spec-type")
    assert argv[i : i + 6] == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "8",
        "--spec-ngram-mod-n-min",
        "2",
    ]
    assert "-md" not in argv
    assert (d["drafted"], d["accepted"], d["steps"]) == (43, 43, 6)
    assert d["mean_acceptance_length"] > 4  # 1 + 43 / 6: more than 1 + the old cap of 3


def test_serve_prints_draft_simple_with_its_classic_draft(cli, engine, targets) -> None:
    r = cli(
        "serve",
        "--target",
        str(targets["target"]),
        "--spec",
        f"draft-simple:{targets['same']}",
        "--budget",
        "3",
        "--print",
        "--llama-bin",
        str(engine.bin_dir),
    )
    assert r.returncode == 0, r.stderr
    assert f"-md {targets['same']} --spec-type draft-simple --spec-draft-n-max 3 --metrics" in r.stdout


def test_a_long_per_position_list_is_cut_after_its_last_acceptance() -> None:
    """ngram-mod's 64 positions made every table row 10 lines tall: past 8, the trailing zeros are counted."""
    from dsparkcli.bench.report import _per_pos
    from dsparkcli.bench.summaries import DraftSummary, Spread, SummaryRecord
    from dsparkcli.llama.protocol import SpecCounters

    def row(accepted_per_pos: list[int], steps: int) -> SummaryRecord:  # the typed row report reads (issue 29)
        counters = SpecCounters(drafted=0, accepted=0, steps=steps, accepted_per_pos=tuple(accepted_per_pos))
        drafting = DraftSummary(counters, 0, 0, 0, 0, ())
        return SummaryRecord("c", "all", None, None, False, None, 1, 1, 1, 1, Spread(), None, None, drafting)

    assert _per_pos(row([4] * 3 + [0] * 61, 4)) == "100 100 100 0 0 0 0 0 +56x0"
    assert _per_pos(row([4] * 10 + [0] * 54, 4)) == " ".join(["100"] * 10) + " +54x0"
    assert _per_pos(row([43, 39, 0], 50)) == "86 78 0"  # a DSpark budget's: all shown
