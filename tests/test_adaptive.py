"""dspark's llama.cpp patches on the real (patched) CPU engine, against exact predictions.

Per-request ``speculative.n_max`` / ``n_min`` / ``p_min`` and ``--spec-draft-n-max auto``: on known-answer
pairs the engine's sequence of chosen draft lengths, its drafted/accepted counts, its timings and its
/metrics equal ``budget.rule`` + ``synth.known_answer``'s replay exactly. One server per case, -t 1.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from dsparkcli import runner
from dsparkcli.budget import rule as budget
from dsparkcli.errors import ServerError, UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import protocol
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.cli import REPO, interrupt_when
from support.plans import dry_run_plan

BLOCK = 8
PROMPTS = (([1, 2, 3], 48), ([77], 29), ([5, 100, 42], 40), ([126], 3))
# a draft pays a little at high acceptance and not at all at low: the choice moves with the estimate
MIXED = {0: 10.0, 1: 15.0, 2: 16.0, 3: 17.0, 5: 19.0, 8: 22.0}
NEVER = {0: 1.0, 1: 50.0, 8: 90.0}  # no acceptance pays for this step cost: every step chooses k = 0
K_LINE = re.compile(r"adaptive draft: k = (\d+) of (\d+)")


@pytest.fixture(scope="module")
def patched(engine) -> engine_mod.Engine:
    """The session's engine must carry dspark's patches (`make test` builds it so): a failure, not a skip."""
    caps = engine_mod.capabilities(engine)
    assert caps.request_draft_params and caps.adaptive_budget, (
        f"{engine.server} lacks dspark's patch series: run `dspark engine build` (patched by default)"
    )
    return engine


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, synth.SynthPair]:
    root = tmp_path_factory.mktemp("pairs")
    return {
        "0.7": synth.write_pair(root / "q07", accept_rate=0.7, seed=11, block_size=BLOCK),
        "0.3": synth.write_pair(root / "q03", accept_rate=0.3, seed=5, block_size=BLOCK),
        "conf": synth.write_pair(root / "conf", accept_rate=0.7, confidence=True, seed=3, block_size=BLOCK),
    }


def table_file(tmp_path: Path, points: dict[int, float], s: float) -> tuple[Path, budget.CostTable]:
    path = tmp_path / "cost.txt"
    path.write_text(budget.format_cost_table(points, s, comment="test"))
    return path, budget.parse_cost_table(path.read_text())


def serve(engine, pair: synth.SynthPair, tmp_path: Path, **kw) -> LlamaServer:
    cfg = ServerConfig(model=pair.target, draft=pair.draft, ctx=1024, threads=1, **kw)
    return LlamaServer(engine, cfg, log_dir=tmp_path, startup_timeout=60)


def complete(client: ServerClient, prompt: list[int], n_predict: int, **draft) -> dict:
    return client.completion(
        protocol.completion_payload(
            prompt, n_predict=n_predict, response_fields=None, draft=protocol.draft_settings(**draft) or None
        )
    )


def drafts(resp: dict) -> tuple[int, int]:
    return protocol.timings_drafts(resp["timings"])


# ------------------------------------------------------------------ per-request settings (patch 1)


def test_requests_set_their_own_n_max_n_min_and_p_min(patched, pairs, tmp_path):
    pair = pairs["conf"]
    man = synth.load_manifest(pair.manifest)
    with serve(patched, pair, tmp_path, n_max=BLOCK) as srv:
        cases = [
            ({}, {}),  # the server's settings
            ({"n_max": 3}, {"request_n_max": 3}),
            ({"n_max": 0}, {"request_n_max": 0}),  # no draft at all: plain decoding
            # n_min applies to the block the request asks for (patch 0003): 5 > 2, so no draft at all
            ({"n_max": 2, "n_min": 5}, {"request_n_max": 2, "n_min": 5}),
            ({"p_min": 0.5}, {"p_min": 0.5}),  # the confidence head cuts blocks for this request only
            ({"p_min": 0.9, "n_max": 4}, {"p_min": 0.9, "request_n_max": 4}),
        ]
        seen = set()
        for draft, kw in cases:
            for prompt, n_predict in PROMPTS[:3]:
                resp = complete(srv.client, prompt, n_predict, **draft)
                pred = synth.predict(man, prompt, n_max=BLOCK, n_predict=n_predict, **kw)
                assert resp["tokens"] == list(pred.tokens), (draft, prompt)
                assert drafts(resp) == (pred.draft_n, pred.draft_n_accepted), (draft, prompt, pred.blocks)
                settings = resp["generation_settings"]
                assert settings[protocol.SPEC_N_MAX] == draft.get("n_max", BLOCK)
                assert settings[protocol.SPEC_N_MIN] == draft.get("n_min", 0)
                assert settings[protocol.SPEC_P_MIN] == pytest.approx(draft.get("p_min", 0.0))
                seen.add((pred.draft_n, pred.draft_n_accepted))
        assert len(seen) > 6  # the cases really differ
        assert synth.predict(man, [77], n_max=BLOCK, n_predict=29, request_n_max=0).draft_n == 0
        # out-of-range values are the request's error (HTTP 400), not a silent clamp
        for field, value in (
            (protocol.SPEC_N_MAX, -1),
            (protocol.SPEC_N_MAX, "7"),
            (protocol.SPEC_P_MIN, 1.5),
            (protocol.SPEC_N_MAX, protocol.AUTO),
        ):  # auto: this server has no cost table
            with pytest.raises(ServerError, match="400|speculative"):
                srv.client.completion({"prompt": [1], "n_predict": 4, field: value})


# ------------------------------------------------------------------ adaptive budget (patch 2)


@pytest.mark.parametrize("rate", ["0.7", "0.3"])
def test_adaptive_choices_and_counters_equal_the_replay(patched, pairs, tmp_path, rate):
    pair = pairs[rate]
    man = synth.load_manifest(pair.manifest)
    path, table = table_file(tmp_path, MIXED, 0.25)
    with serve(patched, pair, tmp_path, n_max=protocol.AUTO, cost_table=path, extra_args=("-v",)) as srv:
        preds = []
        for prompt, n_predict in PROMPTS:
            resp = complete(srv.client, prompt, n_predict)
            pred = synth.predict(man, prompt, n_max=table.max_k, n_predict=n_predict, budget=table)
            assert resp["tokens"] == list(pred.tokens), prompt
            assert drafts(resp) == (pred.draft_n, pred.draft_n_accepted), (prompt, pred.budgets, pred.blocks)
            assert pred.budget_margin > 1e-6  # no choice hangs on the engine's last bit of arithmetic
            bt = protocol.BudgetTimings.from_timings(resp["timings"])
            assert (bt.steps, bt.total, bt.zero) == (len(pred.budgets), sum(pred.budgets), pred.budgets.count(0))
            preds.append(pred)
        chosen = [int(m.group(1)) for m in K_LINE.finditer(srv.log_path.read_text(errors="replace"))]
        metrics = srv.client.metrics()
    expected = [k for p in preds for k in p.budgets]
    assert chosen == expected  # the engine's own sequence of choices, step for step
    assert protocol.budget_chosen(metrics) == {k: n for k, n in sorted(Counter(expected).items())} | {
        k: 0 for k in range(max(expected) + 1) if k not in expected
    }
    counters = protocol.SpecCounters.from_metrics(metrics)
    assert (counters.drafted, counters.accepted) == (
        sum(p.draft_n for p in preds),
        sum(p.draft_n_accepted for p in preds),
    )
    assert len(set(expected)) >= 2  # the budget really moves within and across requests


def test_a_step_cost_no_acceptance_pays_for_means_plain_decoding(patched, pairs, tmp_path):
    pair = pairs["0.7"]
    man = synth.load_manifest(pair.manifest)
    path, table = table_file(tmp_path, NEVER, 0.0)
    with serve(patched, pair, tmp_path, n_max=protocol.AUTO, cost_table=path) as srv:
        resp = complete(srv.client, [1, 2, 3], 40)
        metrics = srv.client.metrics()
    pred = synth.predict(man, [1, 2, 3], n_max=table.max_k, n_predict=40, budget=table)
    assert pred.budgets == (0,) * 38 and pred.draft_n == 0
    assert resp["tokens"] == list(pred.tokens) and drafts(resp) == (0, 0)
    assert protocol.BudgetTimings.from_timings(resp["timings"]) == protocol.BudgetTimings(38, 0, 38)
    assert protocol.budget_chosen(metrics) == {0: 38}


def test_requests_choose_auto_or_a_fixed_budget_per_request(patched, pairs, tmp_path):
    pair = pairs["0.7"]
    man = synth.load_manifest(pair.manifest)
    path, table = table_file(tmp_path, MIXED, 0.25)
    # a fixed server with a cost table: "auto" per request (capped at the server's n_max, 5)
    with serve(patched, pair, tmp_path, n_max=5, cost_table=path) as srv:
        fixed = complete(srv.client, [5, 100, 42], 40)
        auto = complete(srv.client, [5, 100, 42], 40, n_max=protocol.AUTO)
    assert drafts(fixed) == drafts_of(synth.predict(man, [5, 100, 42], n_max=5, n_predict=40))
    assert drafts(auto) == drafts_of(synth.predict(man, [5, 100, 42], n_max=5, n_predict=40, budget=table))
    assert auto["generation_settings"]["speculative.n_max_auto"] is True
    # an auto server: a request's own number is a fixed budget for that request
    with serve(patched, pair, tmp_path, n_max=protocol.AUTO, cost_table=path) as srv:
        three = complete(srv.client, [5, 100, 42], 40, n_max=3)
    pred = synth.predict(man, [5, 100, 42], n_max=table.max_k, n_predict=40, request_n_max=3)
    assert drafts(three) == drafts_of(pred) and three["tokens"] == list(pred.tokens)
    assert "draft_budget_steps" not in three["timings"]


def drafts_of(pred: synth.Prediction) -> tuple[int, int]:
    return pred.draft_n, pred.draft_n_accepted


def test_cost_tables_the_engine_and_dspark_refuse_alike(patched, tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# c\ns 0.5\n0 10\n2 14  # between: 1 is priced as 2\n5 20.5\n")
    assert budget.parse_cost_table(good.read_text()).step_ms == (
        10.0,
        14.0,
        14.0,
        14.0 + 6.5 * 1 / 3,
        14.0 + 6.5 * 2 / 3,
        20.5,
    )
    for text in ("s 0.5\n", "0 10\nx 3\n", "0 10\n1 2 3\n", "0 10\n1 -2\n", "0 0\n1 3\n", "0 10\n2000 3\n"):
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(budget.CostTableError):
            budget.parse_cost_table(text)
        proc = __import__("subprocess").run(
            [str(patched.server), "--spec-cost-table", str(bad), "-m", "/nonexistent"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and "--spec-cost-table" in (proc.stdout + proc.stderr), text
    proc = __import__("subprocess").run(
        [str(patched.server), "--spec-draft-n-max", "auto", "-m", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "needs --spec-cost-table" in proc.stdout + proc.stderr


def test_run_against_a_server_sends_its_own_budget(patched, pairs, cli, tmp_path):
    """`dspark run --server URL --budget K / --no-draft / --p-min`: the request's own settings, exactly."""
    pair = pairs["conf"]
    man = synth.load_manifest(pair.manifest)
    with serve(patched, pair, tmp_path, n_max=BLOCK) as srv:
        last = synth.last_prompt_token(man, srv.client.apply_template(protocol.build_messages("hello there")))
        for flags, kw in (
            (("--budget", "2"), {"request_n_max": 2}),
            (("--no-draft",), {"request_n_max": 0}),
            (("--p-min", "0.5"), {"p_min": 0.5}),
            ((), {}),
        ):
            proc = cli("run", "--server", srv.url, "hello there", "-n", "30", "--json", *flags)
            assert proc.returncode == 0, proc.stderr
            got = json.loads(proc.stdout)
            pred = synth.predict_from_last(man, last, n_max=BLOCK, n_predict=30, **kw)
            assert got["text"] == pred.text
            assert protocol.timings_drafts(got["timings"]) == (pred.draft_n, pred.draft_n_accepted), flags
        proc = cli("run", "--server", srv.url, "hello", "--budget", "adaptive")  # this server has no cost table
        assert proc.returncode != 0 and "needs the server started with --spec-cost-table" in proc.stderr
    # a server without a draft (serve --budget adaptive leaves it out where no k can pay) has no per-step choice
    # to make: the request decodes as the server does, said in one line (it was refused with HTTP 400)
    with LlamaServer(patched, ServerConfig(model=pair.target, ctx=1024, threads=1), log_dir=tmp_path) as srv:
        proc = cli("run", "--server", srv.url, "hello there", "-n", "30", "--json", "--budget", "adaptive")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["budget"] is None and protocol.timings_drafts(got["timings"]) == (0, 0)
        assert got["text"] == synth.predict_from_last(man, last, n_max=BLOCK, n_predict=30).text  # greedy: the same
        assert "--budget adaptive: this server runs without a draft, so the request decodes plainly" in proc.stderr


def test_a_stock_server_is_refused_before_asking():
    class Stock:  # /props of stock 0c1e570: no speculative.n_max among the default settings
        def props(self):
            return {"default_generation_settings": {"params": {"speculative.types": "draft-dspark"}}}

    with pytest.raises(UsageError, match="ignores a request's --budget/--p-min/--no-draft"):
        runner.require_request_drafts(Stock())  # type: ignore[arg-type]


# ------------------------------------------------------------------ dspark: --budget adaptive


def test_best_case_says_when_no_acceptance_can_make_a_draft_pay():
    """budget.best_case on the two committed tuning tables of the real pair: the CPU's (third draft) cannot
    pay even with every token accepted, the H200's (second draft) can at k = 2; and the claim behind it:
    an estimate of near-certain acceptance still makes the engine's choice k = 0 on the CPU table."""
    cpu = budget.parse_cost_table((REPO / "study/results/cpu/adaptive-smollm2-135m-3/cost-table.txt").read_text())
    h200 = budget.parse_cost_table((REPO / "study/results/h200/adaptive-real/cost-table.txt").read_text())
    assert budget.best_case(cpu) == (3, pytest.approx(4 * 8.179788 / (41.032715 + 3 * 0.368702)))  # 0.78x
    assert budget.best_case(cpu)[1] < 1.0
    assert budget.best_case(h200) == (2, pytest.approx(3 * 1.349404 / (2.352667 + 2 * 0.515184)))  # 1.20x
    sure = budget.Estimate(reach=(50.0,) * 8, acc=(50.0,) * 8)  # 50 of 50 accepted at every position
    assert budget.choose(sure, cpu, cpu.max_k)[0] == 0
    assert budget.choose(sure, h200, h200.max_k)[0] == 2
    never = budget.CostTable.from_points(NEVER)
    assert budget.best_case(never) == (8, pytest.approx(9 / 90))


def _store_tuning(engine, pair, cost) -> str:
    """A tuning record of ``cost`` for this pair as the CLI serves it with --threads 1 --ctx 1024."""
    from dsparkcli.budget import store
    from dsparkcli.budget.record import TuningRecord

    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=8, ctx=1024, threads=1)
    key = store.key_for(engine, cfg)
    store.save(
        TuningRecord(
            key=key,
            cost=cost,
            acceptance=(),
            predictions=(),
            choices=(),
            verified=(),
            budgets=(1, 8),
            timings_s={},
            created="2026-12-01T00:00:00+00:00",
            run_id="r",
            jsonl="x.jsonl",
        )
    )
    return key.id


# t1 and t_step(1) of the CPU's tuning of the real pair, and a k = 8 step: 2 / 21.24 and 9 / 82.96 tokens per
# ms against plain's 1 / 8.18, so k = 8 is the best length and still 0.89x plain: no draft can pay
HOPELESS = dict(t1_ms=8.18, t_step_ms=((1, 20.87), (8, 80.0)), s_ms=0.37)
NO_DRAFT_NOTE = (
    "no draft can pay even with every token accepted (best: k = 8, 0.89x plain), so the draft is not "
    "loaded and every request decodes as plain does (--budget N keeps it)"
)


def test_adaptive_leaves_out_a_draft_no_acceptance_can_pay_for(patched, pairs, tmp_path, monkeypatch):
    from dsparkcli.budget.choice import Want, category_budgets, chosen_server
    from dsparkcli.budget.model import CostModel

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    pair = pairs["0.7"]
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=8, ctx=1024, threads=1)
    _store_tuning(patched, pair, CostModel(**HOPELESS))
    served, choice = chosen_server(patched, cfg, Want(adaptive=True))
    assert choice.message.endswith(NO_DRAFT_NOTE) and choice.without_draft and choice.plain
    assert served == ServerConfig(model=pair.target, ctx=1024, threads=1)  # the draft and its settings gone
    assert "-md" not in served.argv(patched.server, 0) and category_budgets(choice) == {}
    key_id = _store_tuning(patched, pair, CostModel(t1_ms=8.18, t_step_ms=((1, 10.0), (8, 30.0)), s_ms=0.37))
    served, choice = chosen_server(patched, cfg, Want(adaptive=True))  # 2.0x at k = 8
    assert (
        choice.message
        == (f"adaptive budget: llama.cpp picks 0..8 per step from tuning {key_id}'s step costs (measured at k = 1, 8)")
        and not choice.without_draft
    )
    assert served.draft == pair.draft and served.n_max == protocol.AUTO and served.cost_table == choice.cost_table


def test_run_serve_and_bench_adaptive_without_a_draft_worth_loading(patched, pairs, cli, tmp_path, monkeypatch):
    """The CLI on a stored tuning where no draft can pay: run and serve start llama-server without -md and
    say why; bench's adaptive arm runs without the draft too (identical to plain, nothing drafted), while
    its fixed budget keeps it."""
    from dsparkcli.budget.model import CostModel

    pair = pairs["0.7"]
    env = {
        "DSPARK_LLAMA_BIN": str(patched.bin_dir),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    monkeypatch.setenv("DSPARK_CACHE_DIR", env["DSPARK_CACHE_DIR"])
    _store_tuning(patched, pair, CostModel(**HOPELESS))
    files = ["--target", str(pair.target), "--draft", str(pair.draft), "--threads", "1", "--ctx", "1024"]
    proc = cli("run", *files, "hello there", "-n", "16", "--budget", "adaptive", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert NO_DRAFT_NOTE in proc.stderr
    result = json.loads(proc.stdout)
    assert "-md" not in result["server_argv"] and result["budget"] is None and "draft" not in result["files"]
    proc = cli("serve", *files, "--budget", "adaptive", "--print", "--json", env=env)
    assert proc.returncode == 0 and NO_DRAFT_NOTE in proc.stderr
    assert "-md" not in json.loads(proc.stdout)["argv"]
    proc = cli("run", *files, "hello there", "-n", "16", "--budget", "adaptive", "--compare", env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "dspark: error: --compare --budget adaptive: this tuning leaves no draft worth loading"
    )

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(f'{{"id": "a-{i}", "category": "alpha", "prompt": "question {i}"}}\n' for i in range(2))
    )
    out = tmp_path / "b.jsonl"
    proc = cli(
        "bench",
        *files,
        "--prompts",
        str(prompts),
        "--budget",
        "2",
        "adaptive",
        "--reps",
        "1",
        "-n",
        "16",
        "--json",
        "--out",
        str(out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert NO_DRAFT_NOTE in proc.stderr
    rows = {(s["config"], s["category"]): s for s in json.loads(proc.stdout)["summaries"]}
    adaptive = rows[("draft-dspark@adaptive", "all")]
    assert adaptive["drafted"] == 0 and adaptive["identical"] == adaptive["prompts"] == 2
    assert rows[("draft-dspark@2", "all")]["drafted"] > 0
    argv = {
        r["config"]: r["server_argv"]
        for r in map(json.loads, out.read_text().splitlines())
        if r["record"] == "request"
    }
    assert "-md" not in argv["draft-dspark@adaptive"] and "-md" in argv["draft-dspark@2"]


def test_tune_adaptive_then_run_and_bench_with_budget_adaptive(patched, cli, tmp_path):
    """tune --adaptive measures llama.cpp's per-step budget next to its picks; run and bench use the
    stored cost table with --budget adaptive (one line saying which), outputs identical to plain."""
    # always right, a target dear enough that drafting pays on a CPU (test_tune's "right" pair)
    pair = synth.write_pair(tmp_path / "pair", accept_rate=1.0, seed=3, block_size=BLOCK, target_layers=24)
    env = {
        "DSPARK_LLAMA_BIN": str(patched.bin_dir),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            f'{{"id": "{c}-{i}", "category": "{c}", "prompt": "{c} question {i}"}}\n'
            for c in ("alpha", "beta")
            for i in range(2)
        )
    )
    files = ["--target", str(pair.target), "--draft", str(pair.draft)]
    common = ["--threads", "1", "--ctx", "1024"]
    proc = cli(
        "tune",
        *files,
        "--prompts",
        str(prompts),
        "--budgets",
        "1",
        "4",
        "8",
        "-n",
        "48",
        *common,
        "--adaptive",
        "--json",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    measured = {(v["category"], v["candidate"]) for v in doc["verified"]}
    assert {("alpha", "adaptive"), ("beta", "adaptive"), ("all", "adaptive")} <= measured
    table = Path(doc["jsonl"]).with_suffix(".cost.txt")
    assert budget.parse_cost_table(table.read_text()).max_k == 8

    proc = cli("run", *files, "hello there", "-n", "24", *common, "--budget", "adaptive", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"adaptive budget: llama.cpp picks 0..8 per step from tuning {doc['key_id']}'s step costs" in proc.stderr
    result = json.loads(proc.stdout)
    # what run does follows from the measured table: the draft where some k can pay at full acceptance,
    # none otherwise (on a loaded 2-core machine tune's step costs sometimes say so, for this pair too)
    k, best = budget.best_case(budget.parse_cost_table(table.read_text()))
    if best > 1.0:
        assert result["budget"] == protocol.AUTO and result["timings"]["draft_budget_steps"] > 0
    else:
        assert result["budget"] is None and "no draft can pay even with every token accepted" in proc.stderr
    proc = cli(
        "run",
        *files,
        "hello there",
        "-n",
        "8",
        "--threads",
        "2",
        "--ctx",
        "1024",
        "--budget",
        "adaptive",
        "--json",
        env=env,
    )  # another -t: no cost table for it, so the default budget, the setting named
    assert proc.returncode == 0 and json.loads(proc.stdout)["budget"] == 5
    assert (
        "--budget adaptive: no tuning matches this pair, engine and settings: it was tuned with --threads 1 "
        "(here 2); using budget 5"
    ) in proc.stderr

    out = tmp_path / "b.jsonl"
    proc = cli(
        "bench",
        *files,
        "--prompts",
        str(prompts),
        "--budget",
        "2",
        "adaptive",
        "--reps",
        "1",
        "-n",
        "24",
        *common,
        "--json",
        "--out",
        str(out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {(s["config"], s["category"]): s for s in json.loads(proc.stdout)["summaries"]}
    assert {c for c, _ in rows} == {"plain", "draft-dspark@2", "draft-dspark@adaptive"}
    adaptive = rows[("draft-dspark@adaptive", "all")]
    assert adaptive["budget"] == 8 and adaptive["identical"] == adaptive["prompts"]
    argv = next(
        r["server_argv"]
        for r in map(json.loads, out.read_text().splitlines())
        if r["record"] == "request" and r["config"] == "draft-dspark@adaptive"
    )
    if best > 1.0:
        assert argv[argv.index("--spec-draft-n-max") + 1] == "auto" and "--spec-cost-table" in argv
    else:  # the same table run and bench read: the arm's server runs without the draft, as run's did
        assert "--spec-draft-n-max" not in argv and "--spec-cost-table" not in argv and "-md" not in argv

    # serve --budget adaptive: every request picks its own budget per step; a client can ask for "auto" too
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        client = ServerClient(url)
        try:
            return client.health() == 200
        except ServerError:
            return False
        finally:
            client.close()

    def ask() -> subprocess.CompletedProcess[str]:
        return cli("run", "--server", url, "hello there", "-n", "24", "--budget", "adaptive", "--json", env=env)

    rc, stdout, stderr, asked = interrupt_when(
        ["serve", *files, *common, "--budget", "adaptive", "--port", str(port), "--json"], healthy, env=env, before=ask
    )
    assert rc == 0, stderr
    assert "adaptive budget: llama.cpp picks 0..8" in stderr and asked.returncode == 0, asked.stderr
    if best > 1.0:
        assert json.loads(stdout)["budget"] == protocol.AUTO
        assert json.loads(asked.stdout)["timings"]["draft_budget_steps"] > 0
    else:
        assert json.loads(stdout)["budget"] is None and "no draft can pay" in stderr


def test_the_adaptive_plan_dry_runs_here(patched, tmp_path, monkeypatch):
    """study/plans/adaptive.toml (the former study/adaptive_real.sh, the CPU and H200 measurement): tune
    --adaptive, then bench plain, fixed budgets and adaptive, dry-run by the lease tool on the CPU engine with its
    known-answer pair and tiny sizes."""
    out = dry_run_plan("adaptive", patched, tmp_path, monkeypatch) / "adaptive-real"
    assert any(v["candidate"] == "adaptive" for v in json.loads((out / "tune.json").read_text())["verified"])
    configs = {s["config"] for s in json.loads((out / "bench.json").read_text())["summaries"]}
    assert configs == {"plain", "draft-dspark@1", "draft-dspark@3", "draft-dspark@adaptive"}
    assert "draft-dspark@adaptive" in (out / "speedup.txt").read_text()  # the speedup table


def test_bench_budget_auto_serves_each_category_its_own_pick(patched, pairs, cli, tmp_path, monkeypatch):
    """A tuning that picked budget 3 for one category and plain decoding for another (the H200's kit: math
    k = 3, general plain): bench's auto arm runs one server at 3 and sends each request its category's
    speculative.n_max, so the first category drafts exactly as the budget-3 arm does and the second drafts
    nothing and decodes as plain does; the overall pick (plain here) would have left the draft out for both."""
    from dsparkcli.budget import store
    from dsparkcli.budget.model import OVERALL, Candidate, Choice, CostModel
    from dsparkcli.budget.record import TuningRecord

    pair = pairs["0.7"]
    env = {
        "DSPARK_LLAMA_BIN": str(patched.bin_dir),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    monkeypatch.setenv("DSPARK_CACHE_DIR", env["DSPARK_CACHE_DIR"])
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=8, ctx=1024, threads=1)
    choices = (
        Choice("alpha", Candidate(3, 0.0), 1.2, 1.3),
        Choice("beta", None, None, None),
        Choice(OVERALL, None, None, None),
    )
    store.save(
        TuningRecord(
            key=store.key_for(patched, cfg),
            cost=CostModel(t1_ms=8.0, t_step_ms=((1, 9.0), (3, 11.0)), s_ms=0.3),
            acceptance=(),
            predictions=(),
            choices=choices,
            budgets=(1, 3),
            created="2026-12-02T00:00:00+00:00",
            run_id="r",
            jsonl="x.jsonl",
        )
    )
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            f'{{"id": "{c}-{i}", "category": "{c}", "prompt": "question {i} of {c}"}}\n'
            for c in ("alpha", "beta")
            for i in range(2)
        )
    )
    out = tmp_path / "b.jsonl"
    files = ["--target", str(pair.target), "--draft", str(pair.draft), "--threads", "1", "--ctx", "1024"]
    proc = cli(
        "bench",
        *files,
        "--prompts",
        str(prompts),
        "--budget",
        "3",
        "auto",
        "--reps",
        "1",
        "-n",
        "24",
        "--json",
        "--out",
        str(out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--budget auto per category: alpha 3, beta plain (one server at the largest" in proc.stderr
    reqs = [r for r in map(json.loads, out.read_text().splitlines()) if r["record"] == "request"]
    by = {(r["config"], r["prompt_id"]): r for r in reqs}
    for i in range(2):
        auto_a, fixed_a = by[("draft-dspark@auto", f"alpha-{i}")], by[("draft-dspark@3", f"alpha-{i}")]
        assert auto_a["request_n_max"] == 3 and auto_a["draft_n"] == fixed_a["draft_n"] > 0
        assert auto_a["draft_n_accepted"] == fixed_a["draft_n_accepted"]
        auto_b, plain_b = by[("draft-dspark@auto", f"beta-{i}")], by[("plain", f"beta-{i}")]
        assert auto_b["request_n_max"] == 0 and auto_b["draft_n"] == 0
        assert auto_b["output_sha256"] == plain_b["output_sha256"]
    assert "-md" in next(r["server_argv"] for r in reqs if r["config"] == "draft-dspark@auto")
