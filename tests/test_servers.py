"""bench.servers: one loaded llama-server runs several budgets through a per-request speculative.n_max.

The logic (which server can serve which configuration) is checked on configurations; the claim it rests
on (a budget on a shared server drafts and accepts exactly as on a server of its own, real and
SYNTHETIC acceptance alike) on the real engine with known-answer pairs, counter for counter. tune's
use of it is checked by counting llama-server launches.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from dsparkcli.bench import tuning
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import measured, read_jsonl
from dsparkcli.bench.run import new_pool, run_bench
from dsparkcli.bench.servers import can_serve, effective_rates, plan_hosts, request_fields
from dsparkcli.budget.model import synth_rates
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.logs import request_log
from support.scripts import run_script

T, D = Path("t.gguf"), Path("d.gguf")
PROMPTS = tuple(
    Prompt(f"{c}-{i}", c, f"{c} question number {i}, answer briefly") for c in ("alpha", "beta") for i in range(2)
)


def _cfg(**kw) -> ServerConfig:
    return ServerConfig(model=T, **{"draft": D, **kw})


def test_a_larger_budget_serves_a_smaller_one_with_the_same_everything_else():
    host = _cfg(n_max=7)
    assert can_serve(host, _cfg(n_max=3)) and request_fields(host, _cfg(n_max=3)) == {"speculative.n_max": 3}
    assert can_serve(host, host) and request_fields(host, host) == {}
    assert not can_serve(_cfg(n_max=3), host)  # a request cannot raise the server's budget
    assert not can_serve(host, _cfg(n_max=3, p_min=0.5))  # any other argv difference: its own server
    assert not can_serve(host, _cfg(n_max=3, ctx=2048))
    assert not can_serve(host, ServerConfig(model=T))  # plain decoding is not a draft server at n_max 0
    assert not can_serve(_cfg(n_max="auto", cost_table=Path("c.txt")), _cfg(n_max=3))


def test_synthetic_acceptance_is_shared_only_when_the_rates_are_a_prefix():
    big = _cfg(n_max=7, synth_len=4.0)
    rates = synth_rates(4.0, 7)
    assert effective_rates(big) == rates
    assert can_serve(big, _cfg(n_max=3, synth_rates=rates[:3]))  # tune's "rates" mode: what a real draft does
    # --spec-synth-len 4 at budget 3 is another geometric ratio: not what the budget-7 server emulates
    assert not can_serve(big, _cfg(n_max=3, synth_len=4.0))
    assert not can_serve(big, _cfg(n_max=3, synth_rates=tuple(r * 0.9 for r in rates[:3])))
    assert not can_serve(big, _cfg(n_max=3))  # real acceptance on an emulating server
    # --spec-synth-len 1 (tune's cost cells): no draft position is ever accepted, at every budget
    assert can_serve(_cfg(n_max=15, synth_len=1.0), _cfg(n_max=2, synth_len=1.0))


def test_a_plans_budgets_share_the_server_of_its_largest():
    plain, k1, k3, k5, odd = (
        ServerConfig(model=T),
        _cfg(n_max=1),
        _cfg(n_max=3),
        _cfg(n_max=5),
        _cfg(n_max=2, p_min=0.4),
    )
    assert plan_hosts([plain, k1, k3, k5, odd]) == [plain, k5, k5, k5, odd]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("servers"), vocab=128, accept_rate=0.7, seed=11)


def _counters(records, config):
    _, counters = measured(records)
    mine = [c.counters for c in counters if c.config == config]
    return sum(c.drafted for c in mine), sum(c.accepted for c in mine), sum(c.steps for c in mine)


def _launches(cache: Path) -> int:
    return len(list((cache / "logs").glob("llama-server-*.log")))


@pytest.mark.parametrize("synthetic", [False, True], ids=["real-acceptance", "synthetic-rates"])
def test_a_shared_server_drafts_and_accepts_exactly_like_its_own(engine, pair, tmp_path, monkeypatch, synthetic):
    caps = engine_mod.capabilities(engine)
    assert caps.request_draft_params, f"{engine.server} lacks dspark's patch series (make test builds it)"
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    d = Draft("draft", pair.draft)
    rates = synth_rates(3.0, 6)

    def arm(k: int) -> Arm:
        return Arm(f"draft@{k}", d, k, synth_rates=rates[:k]) if synthetic else Arm(f"draft@{k}", d, k)

    plan = BenchPlan(
        target=pair.target,
        drafts=(d,),
        budgets=(),
        prompts=PROMPTS,
        reps=1,
        warmup=0,
        n_predict=40,
        ctx=1024,
        threads=1,
        seed=1,
        ignore_eos=True,
        explicit_arms=(arm(2), arm(4), arm(6)),
    )
    alone = run_bench(engine, plan, out=tmp_path / "alone.jsonl", run_id="alone")
    n_alone = _launches(tmp_path / "cache")
    with new_pool(engine, share=True) as pool:
        shared = run_bench(engine, plan, out=tmp_path / "shared.jsonl", run_id="shared", pool=pool)
    assert n_alone == 4 and _launches(tmp_path / "cache") - n_alone == 2  # plain, then one server at budget 6
    a, s = read_jsonl(alone.out, "alone"), read_jsonl(shared.out, "shared")
    for k in (2, 4, 6):
        got, want = _counters(s, f"draft@{k}"), _counters(a, f"draft@{k}")
        assert got == want and got[0] > 0, (k, got, want)
    by = {(r["config"], r["prompt_id"]): r for r in s if r["record"] == "request"}
    assert by[("draft@2", "alpha-0")]["request_n_max"] == 2 and "request_n_max" not in by[("draft@6", "alpha-0")]
    assert (
        all(r["identical_to_plain"] for r in s if r["record"] == "request" and "identical_to_plain" in r) or synthetic
    )  # emulated acceptance is not valid output; real acceptance is exact


def test_tune_keeps_one_plain_and_one_draft_server_across_its_phases(engine, pair, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    tp = tuning.TunePlan(
        target=pair.target,
        draft=pair.draft,
        prompts=PROMPTS,
        budgets=(1, 3, 6),
        threads=1,
        ctx=1024,
        reuse_cost=False,
        n_predict=24,
        cost_n_predict=12,
        synth_len=3.0,
        synth_mode="rates",
        ignore_eos=True,
        top=2,
    )
    rec = tuning.run_tune(engine, tp, out=tmp_path / "tune.jsonl")
    assert rec.complete and rec.verified
    # cost: plain + one server per budget; acceptance: one at budget 6, which also runs a verified k=6;
    # verification: plain decoding's server is the cost phase's, every other candidate starts its own
    labels = list(dict.fromkeys(lb for _, lb, _ in rec.verified))  # in the order they ran
    first_reuses_acceptance = labels[0] == "k=6"
    n = _launches(tmp_path / "cache")
    assert n == 4 + 1 + len(labels) - first_reuses_acceptance, labels
    with new_pool(engine, share=True) as pool:  # sharing: plain, one cost server, one at budget 6
        tuning.run_tune(engine, tp, out=tmp_path / "tune2.jsonl", pool=pool)
    assert _launches(tmp_path / "cache") == n + 3


def test_a_request_budget_drafts_the_block_its_own_server_drafts(engine, pair, tmp_path, monkeypatch):
    """Patch 0003: a request asking for 2 on a server started at 6 drafts a block of 2, token for token what
    a server started at 2 drafts (it used to build and read all 6 slots and truncate: each slot read samples
    the whole vocabulary on the host, ~0.5 ms at 248 k, and the block's forward pass grows with it)."""
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))

    def proposals(n_max: int, fields: dict) -> list[list[int]]:
        from dsparkcli.distill.parity import logged_proposals  # deferred: torch (~1.2 s) only when it runs

        cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=n_max, ctx=1024, threads=1, extra_args=("-v",))
        with LlamaServer(engine, cfg) as srv:
            assert srv.client is not None and srv.log_path is not None
            start = srv.log_path.stat().st_size
            srv.client.completion(
                {"prompt": "alpha question number 0", "n_predict": 24, "temperature": 0, "ignore_eos": True, **fields}
            )
            return logged_proposals(request_log(srv.log_path, start))

    shared, own, big = proposals(6, {"speculative.n_max": 2}), proposals(2, {}), proposals(6, {})
    # (the last drafts of a request may be shorter: the server caps n_max by the tokens still to generate)
    assert shared and max(map(len, shared)) == 2 and max(map(len, big)) == 6
    assert shared == own


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A qwen35moe (gated delta net + attention) target at 5 % width: speculative decoding on it keeps
    --spec-draft-n-max + 1 recurrent snapshots per layer and rolls back to one after each rejection."""
    from dsparkcli.synth.full_width import write_full_width

    fw = write_full_width(
        tmp_path_factory.mktemp("hybrid"), scale=0.05, qtype="Q8_0", draft_qtype="Q8_0", target_arch="qwen35moe"
    )
    return fw.target, fw.draft


def test_a_hybrid_target_rolls_back_alike_on_a_shared_server(engine, hybrid, tmp_path, monkeypatch):
    """Patch 0004 keeps only the conv-state snapshots a rollback of the batch can read: a budget-2 request
    on a budget-6 server (7 snapshot slots, 3 written per step) must give the tokens and counters of a
    budget-2 server (3 slots), with emulated acceptance rolling back 0, 1 or 2 tokens per step."""
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    target, draft = hybrid
    d = Draft("draft", draft)
    rates = (0.8, 0.5)
    prompts = (Prompt("p", "general", "Write a detailed, step-by-step explanation of how a hash map works."),)
    plan = BenchPlan(
        target=target,
        drafts=(d,),
        budgets=(),
        prompts=prompts,
        reps=1,
        warmup=0,
        n_predict=48,
        ctx=1024,
        threads=2,
        seed=1,
        ignore_eos=True,
        with_plain=False,
        explicit_arms=(Arm("draft@2", d, 2, synth_rates=rates),),
    )
    own = read_jsonl(run_bench(engine, plan, out=tmp_path / "own.jsonl", run_id="own").out, "own")
    host = replace(
        plan,
        explicit_arms=(
            Arm("draft@6", d, 6, synth_rates=rates + (0.3, 0.2, 0.1, 0.05)),
            Arm("draft@2", d, 2, synth_rates=rates),
        ),
    )
    with new_pool(engine, share=True) as pool:
        shared = read_jsonl(
            run_bench(engine, host, out=tmp_path / "shared.jsonl", run_id="shared", pool=pool).out, "shared"
        )
    mine = [r for r in shared if r["record"] == "request" and r["config"] == "draft@2"]
    theirs = [r for r in own if r["record"] == "request"]
    assert mine[0]["request_n_max"] == 2 and mine[0]["tokens"] == theirs[0]["tokens"]
    got, want = _counters(shared, "draft@2"), _counters(own, "draft@2")
    assert got == want and 0 < got[1] < got[0], (got, want)  # some drafts accepted, some rolled back
    # the patch off (every snapshot copied, its measurement switch): the same tokens and counters
    monkeypatch.setenv("DSPARK_COPY_ALL_SNAPSHOTS", "1")
    off = read_jsonl(run_bench(engine, plan, out=tmp_path / "off.jsonl", run_id="off").out, "off")
    assert [r["tokens"] for r in off if r["record"] == "request"] == [r["tokens"] for r in theirs]
    assert _counters(off, "draft@2") == want


def test_the_shared_step_cost_script_runs_here(engine, tmp_path):
    """study/shared_step_cost.py, the H200 measurement of patch 0004 on and off, on the CPU engine."""
    out = tmp_path / "ssc"
    proc = run_script(
        "shared_step_cost",
        "--out",
        str(out),
        "--budgets",
        "1",
        "3",
        "--reps",
        "1",
        "--n-predict",
        "12",
        "--threads",
        "1",
        "--copy-all",
        engine_dir=engine.bin_dir,
        cache=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "shared-step-cost.json").read_text())
    assert [(r["config"], r["copy_all_snapshots"]) for r in doc["rows"]] == [
        (c, off) for off in (False, True) for c in ("plain", "cost@1", "cost@3")
    ]
    assert all(r["own_ms"] > 0 and r["shared_ms"] > 0 for r in doc["rows"])


def test_the_step_switches_script_runs_every_switch_set_here(engine, tmp_path):
    """study/step_switches.py, the H200 measurement of patches 0006/0007 on and off, on the CPU engine:
    every switch set runs the same cost cells, the speedup leg runs patched and stock only, and each run's
    records carry its switch set in the run id."""
    out = tmp_path / "sw"
    proc = run_script(
        "step_switches",
        "--out",
        str(out),
        "--budgets",
        "1",
        "3",
        "--patches",
        "0006",
        "0007",
        "--alone",
        "0006",
        "0007",
        "--reps",
        "1",
        "--n-predict",
        "8",
        "--threads",
        "1",
        "--lengths",
        "3.5",
        "--speedup-n-predict",
        "8",
        "--rounds",
        "2",
        engine_dir=engine.bin_dir,
        cache=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "step-switches.json").read_text())
    assert doc["switch_sets"] == {
        "patched": {},
        "stock": {"DSPARK_STOCK_MMVF": "1", "DSPARK_STOCK_ARGMAX": "1"},
        "0006 off": {"DSPARK_STOCK_MMVF": "1"},
        "0007 off": {"DSPARK_STOCK_ARGMAX": "1"},
    }
    cost = [(r["round"], r["config"], r["switches"]) for r in doc["rows"] if r["table"] == "cost"]
    assert cost == [(n, c, s) for n in (1, 2) for c in ("plain", "cost@1", "cost@3") for s in doc["switch_sets"]]
    assert all(r["ms"] > 0 for r in doc["rows"])
    assert [r["over_stock"] for r in doc["rows"] if r["table"] == "cost" and r["switches"] == "stock"] == [1.0] * 6
    speed = [(r["round"], r["config"], r["switches"]) for r in doc["rows"] if r["table"] == "speedup"]
    assert speed == [(n, "L3.5@5", s) for n in (1, 2) for s in ("patched", "stock")]
    runs = {
        json.loads(line)["run_id"]
        for line in (out / "step-switches.jsonl").read_text().splitlines()
        if json.loads(line).get("record") == "request"
    }
    assert runs == {
        f"{kind}-{s}-r{n}"
        for n in (1, 2)
        for kind, sets in (("cost", ("patched", "stock", "0006-off", "0007-off")), ("speed", ("patched", "stock")))
        for s in sets
    }
    assert not any(v in os.environ for v in ("DSPARK_STOCK_MMVF", "DSPARK_STOCK_ARGMAX"))


def test_step_switches_on_a_real_pair_with_no_graphs_beside_and_graph_counters(engine, pair, tmp_path):
    """Issue 32's H200 run on the CPU engine: a pair given as files, a patch on and off and the no-graphs set,
    one bench run per arm with --graph-stats (the CPU engine has no CUDA graphs to count: the counter lines
    themselves are tested in tests/test_cuda_graph_counts.py)."""
    target, draft = pair.target, pair.draft
    out = tmp_path / "sw"
    proc = run_script(
        "step_switches",
        "--out",
        str(out),
        "--budgets",
        "1",
        "3",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--patches",
        "0006",
        "--no-graphs",
        "--graph-stats",
        "--reps",
        "1",
        "--n-predict",
        "8",
        "--threads",
        "1",
        engine_dir=engine.bin_dir,
        cache=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "step-switches.json").read_text())
    assert doc["switch_sets"] == {
        "patched": {},
        "stock": {"DSPARK_STOCK_MMVF": "1"},
        "no graphs": {"GGML_CUDA_DISABLE_GRAPHS": "1"},
    }
    cost = [(r["config"], r["switches"]) for r in doc["rows"] if r["table"] == "cost"]
    assert cost == [(c, s) for c in ("plain", "cost@1", "cost@3") for s in doc["switch_sets"]]
    stats = json.loads((out / "graph-stats.json").read_text())["runs"]
    assert [(r["switches"], r["configs"]) for r in stats] == [
        (s, c) for s in doc["switch_sets"] for c in (["plain", "cost@1"], ["cost@3"])
    ]
    assert all(r["servers"] == [] for r in stats)  # the CPU engine has no CUDA graphs to count
    assert "GGML_CUDA_DISABLE_GRAPHS" not in os.environ
