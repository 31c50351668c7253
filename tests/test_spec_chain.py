"""Speculation chains (issue 35): ``--spec ngram-mod+dspark`` is one llama-server with both types
(``--spec-type ngram-mod,draft-dspark``: llama.cpp tries the n-gram type first, DSpark where it proposes
nothing), parsed with one-line refusals, labelled ``ngram-mod+dspark@B`` in bench, and measured per type: the
pinned engine's per-type statistics lines (-lv 4) say which type proposed, in the counters records and the
draft summaries. The bench run is on a known-answer pair (real binaries, -t 1): its greedy answer follows a
cycle, so n-gram lookup copies it once it has seen it and DSpark drafts the steps before (measured: 4 DSpark
steps, then 21 n-gram steps of up to 8 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparkcli.bench.plan import BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import PLAIN, CountersRecord
from dsparkcli.bench.summaries import DraftSummary
from dsparkcli.errors import UsageError
from dsparkcli.llama.protocol import SpecCounters, TypeCounters, total_by_type, type_stats
from dsparkcli.llama.speculation import parse
from dsparkcli.synth import known_answer as synth

# two requests' lines of the pinned engine (0c1e570) at -lv 4, verbatim but for the cut tails
LOG = """\
0.11.164.080 I slot print_timing: id  3 | task 0 | draft acceptance = 0.19394 (   32 accepted /   165 generated)
0.11.164.142 I spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    1     29      2, #gen drafts =      2, #acc drafts =     2, #gen tokens =     85, #acc tokens =     9, #mean acc len = 5.50, #acc rate/pos = (1.000, 1.000, 1.000, 1.000, 0.500), dur(b,g,a) = 0.076, 0.171, 0.008 ms
0.11.164.152 I spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    1     27     27, #gen drafts =     27, #acc drafts =    15, #gen tokens =     80, #acc tokens =    23, #mean acc len = 1.85, #acc rate/pos = (0.556, 0.222, 0.074), dur(b,g,a) = 0.002, 496.336, 0.024 ms
0.12.000.001 I spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    2     40      5, #gen drafts =      5, #acc drafts =     4, #gen tokens =    200, #acc tokens =    30
0.12.000.002 I spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    2     35     35, #gen drafts =     35, #acc drafts =    20, #gen tokens =    104, #acc tokens =    30
"""


@pytest.mark.parametrize(
    ("text", "label", "spec_type", "flags"),
    [
        ("ngram-mod+dspark", "ngram-mod+dspark", "ngram-mod,draft-dspark", ()),
        (
            "ngram-mod:n_max=8,n_min=2+dspark",
            "ngram-mod:n_max=8,n_min=2+dspark",
            "ngram-mod,draft-dspark",
            (("--spec-ngram-mod-n-max", 8), ("--spec-ngram-mod-n-min", 2)),
        ),
        (
            "ngram-simple:n_max=16+ngram-mod+draft-simple:m/small.gguf",
            "ngram-simple:n_max=16+ngram-mod+draft-simple:small",
            "ngram-simple,ngram-mod,draft-simple",
            (("--spec-ngram-simple-size-m", 16),),
        ),
        ("NGRAM-SIMPLE + ngram-mod", "ngram-simple+ngram-mod", "ngram-simple,ngram-mod", ()),
    ],
)
def test_a_chain_is_one_server_with_every_type(text, label, spec_type, flags) -> None:
    s = parse(text)
    assert s is not None and s.is_chain
    assert (s.label, s.spec_type, s.flags()) == (label, spec_type, flags)
    assert s.uses_dspark == text.endswith("dspark")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "ngram-mod+dspark+draft-simple",
            "a chain of two draft models (dspark and draft-simple); one server runs one",
        ),
        ("ngram-mod+ngram-mod:n_max=8", "ngram-mod given twice in one chain"),
        (
            "dspark+ngram-mod",
            "llama.cpp tries n-gram types first (ngram-simple, ngram-mod), a draft model last: write ngram-mod+dspark",
        ),
        (
            "ngram-mod+ngram-simple",
            "llama.cpp tries n-gram types first (ngram-simple, ngram-mod), a draft model "
            "last: write ngram-simple+ngram-mod",
        ),
        ("ngram-mod+eagle", "unknown speculation 'eagle' (known: dspark, ngram-mod, ngram-simple, draft-simple)"),
        ("ngram-mod+", "an empty type in the chain (join types with '+': ngram-mod+dspark)"),
        ("ngram-mod:n_max=0x+dspark", "n_max must be an integer (got '0x')"),
        ("ngram-mod+dspark:4", "dspark takes no options (its budget is --budget)"),
    ],
)
def test_a_wrong_chain_is_refused_in_one_line(text, why) -> None:
    with pytest.raises(UsageError) as e:
        parse(text)
    assert str(e.value) == f"--spec {text!r}: {why}"


def test_bench_arms_of_a_chain_run_the_dspark_draft_at_every_budget() -> None:
    prompts = (Prompt(id="c1", category="code", text="x"),)
    d = Draft("q8", Path("d.gguf"))
    chain = parse("ngram-mod:n_max=8+dspark")
    plan = BenchPlan(target=Path("t.gguf"), drafts=(d,), budgets=(2, 4), prompts=prompts, specs=(chain,))
    plan.validate()
    arms = plan.arms()
    assert [a.name for a in arms] == [
        PLAIN,
        "q8@2",
        "q8@4",
        "ngram-mod:n_max=8+dspark@2",
        "ngram-mod:n_max=8+dspark@4",
    ]
    assert [a.draft_label for a in arms[3:]] == ["ngram-mod:n_max=8+dspark"] * 2
    argv = plan.server_config(arms[3]).argv(Path("s"), 1)
    assert argv[argv.index("-md") :] == [
        "-md",
        "d.gguf",
        "--spec-type",
        "ngram-mod,draft-dspark",
        "--spec-ngram-mod-n-max",
        "8",
        "-lv",  # the per-type statistics lines: which type proposed
        "4",
        "--spec-draft-n-max",
        "2",
        "-c",
        "4096",
        "--metrics",
    ]
    assert "-lv" not in plan.server_config(arms[1]).argv(Path("s"), 1)  # one type: its argv as before
    # the chain alone (--spec without dspark): no "q8@B" arms; two drafts: the chain names each
    only = BenchPlan(
        target=Path("t.gguf"), drafts=(d,), budgets=(3,), prompts=prompts, specs=(chain,), dspark_arms=False
    )
    assert [a.name for a in only.arms()] == [PLAIN, "ngram-mod:n_max=8+dspark@3"]
    two = BenchPlan(
        target=Path("t.gguf"), drafts=(d, Draft("q4", Path("e.gguf"))), budgets=(3,), prompts=prompts, specs=(chain,)
    )
    assert [a.name for a in two.arms()][3:] == ["ngram-mod:n_max=8+dspark:q8@3", "ngram-mod:n_max=8+dspark:q4@3"]


def test_per_type_counters_from_the_log() -> None:
    stats = type_stats(LOG)
    assert stats.lines == 2
    assert stats.counters == (
        TypeCounters("ngram-mod", steps=5, drafts=5, drafted=200, accepted=30),
        TypeCounters("draft-dspark", steps=35, drafts=35, drafted=104, accepted=30),
    )
    first = type_stats(LOG[: LOG.index("0.12.000.001")])
    assert stats.minus(first) == (
        TypeCounters("ngram-mod", steps=3, drafts=3, drafted=115, accepted=21),
        TypeCounters("draft-dspark", steps=8, drafts=8, drafted=24, accepted=7),
    )
    assert type_stats("no statistics here") == type_stats("")
    assert total_by_type([first.counters, stats.minus(first)]) == stats.counters


def test_by_type_is_written_only_for_a_chain() -> None:
    by_type = type_stats(LOG).counters
    c = SpecCounters(drafted=304, accepted=60, steps=40)
    rec = CountersRecord("ngram-mod+dspark@3", "code", 0, c, by_type=by_type).to_record()
    assert rec["by_type"][0] == {"type": "ngram-mod", "steps": 5, "drafts": 5, "drafted": 200, "accepted": 30}
    assert CountersRecord.from_record(rec).by_type == by_type
    assert "by_type" not in CountersRecord("q8@3", "code", 0, c).to_record()
    summary = DraftSummary(c, 304, 60, 1, 1, (), by_type=by_type)
    assert DraftSummary.from_record(summary.to_record()) == summary
    assert "by_type" not in DraftSummary(c, 304, 60, 1, 1, ()).to_record()


def test_bench_refuses_a_wrong_chain_before_anything_runs(cli) -> None:
    r = cli("bench", "--spec", "dspark+ngram-mod", "--budget", "3")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "dspark: error: --spec 'dspark+ngram-mod': llama.cpp tries n-gram types first (ngram-simple, ngram-mod), "
        "a draft model last: write ngram-mod+dspark"
    ]


def test_run_refuses_no_draft_with_a_dspark_chain(cli, engine, tmp_path) -> None:
    pair = synth.write_pair(tmp_path / "p", accept_rate=1.0, seed=7)
    r = cli(
        "run",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--no-draft",
        "--spec",
        "ngram-mod+dspark",
        "--llama-bin",
        str(engine.bin_dir),
        "hello",
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[0].endswith("the chain runs the DSpark draft")


N = 200  # long enough for n-gram lookup to take over from DSpark
NGRAM = "ngram-mod:n_max=8,n_min=2"


@pytest.fixture(scope="module")
def chain_bench(engine, tmp_path_factory):
    from support.cli import run_cli

    tmp = tmp_path_factory.mktemp("chain")
    pair = synth.write_pair(tmp / "pair", accept_rate=1.0, seed=7)
    prompts = tmp / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t1", "category": "text", "prompt": "hello"}) + "\n")
    out = tmp / "r.jsonl"
    proc = run_cli(
        "bench",
        "--target",
        str(pair.target),
        "--draft",
        f"ka={pair.draft}",
        "--prompts",
        str(prompts),
        "--spec",
        "dspark",
        "--spec",
        NGRAM,
        "--spec",
        f"{NGRAM}+dspark",
        "--budget",
        "3",
        "--reps",
        "1",
        "--warmup",
        "1",
        "-n",
        str(N),
        "-t",
        "1",
        "--ctx",
        "1024",
        "--json",
        "--out",
        str(out),
        env={"DSPARK_LLAMA_BIN": str(engine.bin_dir)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return json.loads(proc.stdout), records


def test_the_chain_drafts_with_ngram_where_it_matches_and_dspark_elsewhere(chain_bench) -> None:
    doc, records = chain_bench
    chain = f"{NGRAM}+dspark@3"
    rows = {(s["config"], s["category"]): s for s in doc["summaries"]}
    assert {c for c, _ in rows} == {PLAIN, "ka@3", NGRAM, chain}
    [block] = [r for r in records if r["record"] == "counters" and r["config"] == chain]
    assert block["draft"] == f"{NGRAM}+dspark"
    i = block["server_argv"].index("--spec-type")
    assert block["server_argv"][i + 1] == "ngram-mod,draft-dspark"
    ngram, dspark = (TypeCounters.from_record(t) for t in block["by_type"])
    assert (ngram.type, dspark.type) == ("ngram-mod", "draft-dspark")
    # the types' shares are the block's /metrics counters, exactly
    assert ngram.steps + dspark.steps == block["steps"]
    assert ngram.drafted + dspark.drafted == block["drafted"]
    assert ngram.accepted + dspark.accepted == block["accepted"]
    # both propose: DSpark first (nothing to copy yet), n-gram once the cycle has been seen; both are right
    # every time (the pair's draft is exact, the cycle repeats exactly)
    assert ngram.drafts > 0 and dspark.drafts > 0
    assert (ngram.accepted, dspark.accepted) == (ngram.drafted, dspark.drafted)
    # the budget caps the draft model only: DSpark drafts 3 a step, n-gram its own n_max (8)
    assert dspark.drafted == 3 * dspark.steps
    assert ngram.drafted > 3 * ngram.steps
    # DSpark alone drafts all the way; the chain hands most steps to n-gram
    alone = next(r for r in records if r["record"] == "counters" and r["config"] == "ka@3")
    assert dspark.steps < alone["steps"]
    assert "by_type" not in alone
    # the summary carries the per-type totals; every configuration's output is plain decoding's
    assert rows[(chain, "all")]["by_type"] == block["by_type"]
    assert all(s["identical"] == s["prompts"] == 1 for (c, _), s in rows.items() if c != PLAIN)


def test_serve_prints_a_chain_with_the_pairs_dspark_draft(cli, engine, tmp_path) -> None:
    pair = synth.write_pair(tmp_path / "p", accept_rate=1.0, seed=7)
    r = cli(
        "serve",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--spec",
        "ngram-mod:n_match=4+dspark",
        "--budget",
        "3",
        "--print",
        "--llama-bin",
        str(engine.bin_dir),
    )
    assert r.returncode == 0, r.stderr
    assert (
        f"-md {pair.draft} --spec-type ngram-mod,draft-dspark --spec-ngram-mod-n-match 4 --spec-draft-n-max 3"
        in r.stdout
    )


REAL = Path(__file__).resolve().parents[1] / "study/results/cpu/chain-smollm2-135m/bench.jsonl"


def test_the_committed_real_run_says_which_type_proposed() -> None:
    """The REAL smollm2-135m pair on five Spec-Bench prompts (CPU): llama.cpp's ngram-mod defaults (a 24-token
    match, drafts of 48-64) found nothing to copy in 96 tokens, so the chain drafted with DSpark alone: the same
    drafts, acceptance and outputs as dspark@3, its by_type all draft-dspark, and the n-gram arm identical to
    plain."""
    records = [json.loads(line) for line in REAL.read_text().splitlines()]
    blocks = {(r["config"], r["category"]): r for r in records if r["record"] == "counters"}
    chain = [b for (c, _), b in blocks.items() if c == "ngram-mod+dspark@3"]
    assert len(chain) == 5
    for b in chain:
        ngram, dspark = (TypeCounters.from_record(t) for t in b["by_type"])
        assert (ngram.type, ngram.steps, ngram.drafted) == ("ngram-mod", 0, 0)
        assert (dspark.steps, dspark.drafted, dspark.accepted) == (b["steps"], b["drafted"], b["accepted"])
        alone = blocks[("q8_0@3", b["category"])]
        assert (alone["steps"], alone["drafted"], alone["accepted"]) == (b["steps"], b["drafted"], b["accepted"])
    outputs = {}
    for r in records:
        if r["record"] == "request":
            outputs.setdefault(r["prompt_id"], {})[r["config"]] = r["output_sha256"]
    assert len(outputs) == 5
    for by_config in outputs.values():
        assert by_config["ngram-mod"] == by_config["plain"]
        assert by_config["ngram-mod+dspark@3"] == by_config["q8_0@3"]
