"""`dspark bench --concurrency` with the real llama-server on a synthetic known-answer pair.

Every request of every client is checked against the predictor; the aggregate and latency figures
are checked against the request and pass records they come from; at one client the acceptance
counters equal the prediction exactly (with more, llama.cpp's batched drafting can move them: see
test_counters_under_concurrency_agree_between_metrics_and_timings).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from PIL import Image

from dsparkcli.bench import prompts, report, stats
from dsparkcli.bench.plan import BenchPlan, Draft
from dsparkcli.bench.records import from_record, read_jsonl
from dsparkcli.bench.summaries import written_summaries
from dsparkcli.errors import UsageError
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.chat_oracle import expected_chat
from support.cli import run_cli

N = 32
REPS = 2
BUDGET = 3
LEVELS = (1, 2, 3)
CONFIGS = ("plain", f"draft-dspark@{BUDGET}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("load-bench-pair"), vocab=128, accept_rate=0.7, seed=5)


@pytest.fixture(scope="module")
def kit():
    return prompts.select(prompts.load_prompts(), ["text"], limit=1)  # math, code, general


@pytest.fixture(scope="module")
def predicted(engine, pair, kit):
    man = synth.load_manifest(pair.manifest)
    with LlamaServer(engine, ServerConfig(model=pair.target, threads=1, ctx=512)) as srv:
        return {p.id: expected_chat(srv.client, man, p.messages(), n_max=BUDGET, n_predict=N) for p in kit}


@pytest.fixture(scope="module")
def run(engine, pair, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load-bench")
    out, plot = tmp / "r.jsonl", tmp / "load.png"
    proc = run_cli(
        "bench",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--budget",
        str(BUDGET),
        "--concurrency",
        *map(str, LEVELS),
        "--category",
        "text",
        "--limit",
        "1",
        "--reps",
        str(REPS),
        "-n",
        str(N),
        "-t",
        "1",
        "--ctx",
        "512",
        "--json",
        "--out",
        str(out),
        "--plot",
        str(plot),
        env={"DSPARK_LLAMA_BIN": str(engine.bin_dir)},
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), [json.loads(ln) for ln in out.read_text().splitlines()], out, plot


def test_every_request_of_every_client_is_its_own_prediction(run, kit, predicted):
    _, records, _, _ = run
    requests = [r for r in records if r["record"] == "request"]
    assert len(requests) == len(CONFIGS) * sum(LEVELS) * len(kit) * REPS  # warm-up is not recorded
    for r in requests:
        assert r["tokens"] == list(predicted[r["prompt_id"]].tokens), (r["config"], r["concurrency"], r["client"])
        assert r["n_predicted"] == N and 0 <= r["client"] < r["concurrency"]
        assert 0 < r["ttft_ms"] <= r["request_ms"]
        argv = r["server_argv"]
        assert argv[argv.index("-np") + 1] == str(r["concurrency"])
        assert argv[argv.index("-c") + 1] == str(512 * r["concurrency"])  # --ctx is per client
        if r["config"] != "plain":
            assert r["identical_to_plain"] is True and r["plain_sha256"] == r["output_sha256"]
    # each client asks the whole kit in every pass, starting at its own prompt
    for c in LEVELS:
        for client in range(c):
            mine = [
                r["prompt_id"]
                for r in requests
                if (r["config"], r["concurrency"], r["client"], r["rep"]) == ("plain", c, client, 0)
            ]
            start = client * len(kit) // c
            assert mine == [p.id for p in [*kit[start:], *kit[:start]]]


def test_figures_come_from_their_records(run, kit):
    doc, records, _, _ = run
    rows = {(s["config"], s["concurrency"]): s for s in doc["summaries"]}
    assert set(rows) == {(cfg, c) for cfg in CONFIGS for c in LEVELS}
    for (cfg, c), row in rows.items():
        passes = [r for r in records if r["record"] == "pass" and (r["config"], r["concurrency"]) == (cfg, c)]
        reqs = [r for r in records if r["record"] == "request" and (r["config"], r["concurrency"]) == (cfg, c)]
        assert [p["rep"] for p in passes] == list(range(REPS))
        for p in passes:
            assert p["requests"] == c * len(kit) and p["tokens"] == c * len(kit) * N
            assert p["tok_s"] == p["tokens"] / p["wall_s"]
        agg = [p["tok_s"] for p in passes]
        assert row["tok_s"] == {"median": statistics.median(agg), "min": min(agg), "max": max(agg)}
        assert row["requests"] == len(reqs) and row["tokens"] == len(reqs) * N
        lat = sorted(r["request_ms"] for r in reqs)
        assert row["latency_ms"] == {
            "p50": lat[math.ceil(0.5 * len(lat)) - 1],
            "p95": lat[math.ceil(0.95 * len(lat)) - 1],
            "max": lat[-1],
        }
        ttft = sorted(r["ttft_ms"] for r in reqs)
        assert row["ttft_ms"]["max"] == ttft[-1] and row["ttft_ms"]["p50"] == ttft[math.ceil(0.5 * len(ttft)) - 1]
        assert row["request_tok_s"]["median"] == statistics.median(r["tok_s"] for r in reqs)
        assert row["speedup"] == row["tok_s"]["median"] / rows[("plain", c)]["tok_s"]["median"]
        if cfg != "plain":
            assert row["identical"] == row["prompts"] == len(kit) and row["divergent"] == []
    assert doc["crossover"] == {CONFIGS[1]: next((c for c in LEVELS if rows[(CONFIGS[1], c)]["speedup"] < 1), None)}


def test_one_client_counts_exactly_as_predicted(run, kit, predicted):
    doc, _, _, _ = run
    row = next(s for s in doc["summaries"] if s["config"] != "plain" and s["concurrency"] == 1)
    preds = [predicted[p.id] for p in kit]
    assert (row["drafted"], row["accepted"], row["steps"]) == (
        REPS * sum(p.draft_n for p in preds),
        REPS * sum(p.draft_n_accepted for p in preds),
        REPS * sum(p.steps for p in preds),
    )
    assert row["mean_length"] == 1 + row["accepted"] / row["steps"]


def test_counters_under_concurrency_agree_between_metrics_and_timings(run, kit, predicted):
    """With several slots drafting in one batch, llama.cpp (0c1e570) sometimes drafts more and accepts
    less than one stream would, for the same (exact) outputs: seen as 43 drafted / 16 accepted instead
    of 40 / 17 on this pair with 4 clients, and not on every run. /metrics and the per-request timings
    always count the same drafts."""
    doc, _, _, _ = run
    preds = [predicted[p.id] for p in kit]
    for s in doc["summaries"]:
        if s["config"] == "plain":
            continue
        c = s["concurrency"]
        assert s["drafted"] == s["timings_drafted"] and s["accepted"] == s["timings_accepted"]
        one = (REPS * c * sum(p.draft_n for p in preds), REPS * c * sum(p.draft_n_accepted for p in preds))
        print(f"{c} clients: drafted {s['drafted']}, accepted {s['accepted']} (one stream: {one[0]}, {one[1]})")


def test_every_line_round_trips_and_rebuilds_the_summaries(run):
    doc, records, out, _ = run
    assert {r["record"] for r in records} == {"prompt", "request", "counters", "pass", "load_summary", "overhead"}
    for r in records:
        plain = {k: v for k, v in r.items() if k not in ("run_id", "provenance")}
        assert from_record(r).to_record() == plain, r["record"]
        assert r["provenance"]["concurrency"] == list(LEVELS)
    printed = [{k: v for k, v in s.items() if k != "load_s"} for s in doc["summaries"]]
    assert [s.to_record() for s in stats.summarize(read_jsonl(out))] == printed


def test_every_format_shows_the_load_columns(run, engine, pair, tmp_path):
    doc, _, _, plot = run
    summaries = written_summaries(doc["summaries"])
    csv = report.to_csv(summaries).splitlines()
    assert csv[0].split(",") == list(report.LOAD_CSV_FIELDS) and len(csv) == 1 + len(summaries)
    md = report.to_markdown(summaries)
    assert "| config | clients | agg tok/s |" in md and md.strip().splitlines()[-1].startswith("crossover: ")
    with Image.open(plot) as im:
        assert im.format == "PNG" and im.height >= 800
    proc = run_cli(
        "bench",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--budget",
        "3",
        "--concurrency",
        "2",
        "--category",
        "math",
        "--limit",
        "1",
        "--reps",
        "1",
        "-n",
        "8",
        "-t",
        "1",
        "--ctx",
        "256",
        "--out",
        str(tmp_path / "t.jsonl"),
        env={"DSPARK_LLAMA_BIN": str(engine.bin_dir), "COLUMNS": "250"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TTFT ms p50/p95/max" in proc.stdout and "crossover: draft-dspark@3" in proc.stdout


def test_concurrency_values_are_checked(pair, kit):
    plan = BenchPlan(
        target=pair.target, drafts=(Draft("d", pair.draft),), budgets=(3,), prompts=kit, concurrency=(2, 2)
    )
    with pytest.raises(UsageError, match="--concurrency values must be distinct"):
        plan.validate()
    with pytest.raises(UsageError, match=r"--concurrency values must be >= 1 \(got 0, 2\)"):
        BenchPlan(
            target=pair.target, drafts=(Draft("d", pair.draft),), budgets=(3,), prompts=kit, concurrency=(0, 2)
        ).validate()
    assert BenchPlan(
        target=Path("t"),
        drafts=(Draft("d", Path("d")),),
        budgets=(3, 5),
        prompts=kit,
        reps=2,
        warmup=1,
        concurrency=(1, 4),
    ).total_requests() == 3 * (1 + 4) * (1 + 3 * 2)


def test_a_dropped_connection_is_sent_again_and_a_dead_server_named(engine, pair) -> None:
    import os
    import signal

    from dsparkcli.bench.requests import surviving
    from dsparkcli.errors import ServerError

    with LlamaServer(engine, ServerConfig(model=pair.target, threads=1, ctx=512)) as srv:
        calls = []

        def flaky(drops: int):  # the first `drops` sends lose their connection, as httpx reports it
            def send():
                calls.append(1)
                if len(calls) <= drops:
                    raise ServerError(
                        "connection to llama-server lost during generation: RemoteProtocolError", kind="crash"
                    )
                return srv.client.completion({"prompt": [1, 2, 3], "n_predict": 4, "temperature": 0})

            return send

        r = surviving(srv, "plain x16", flaky(1))
        assert len(calls) == 2 and r["tokens_predicted"] == 4  # asked again on a live server, answered
        calls.clear()
        with pytest.raises(ServerError, match=r"^llama-server dropped a plain x16 request twice"):
            surviving(srv, "plain x16", flaky(2))
        assert len(calls) == 2
        calls.clear()
        with pytest.raises(ServerError, match="exit") as http_err:  # an HTTP error is not retried
            surviving(srv, "x", lambda: (calls.append(1), (_ for _ in ()).throw(ServerError("exit", kind="http")))[1])
        assert len(calls) == 1 and http_err.value.kind == "http"
        os.kill(srv.pid, signal.SIGKILL)
        calls.clear()
        with pytest.raises(ServerError) as died:
            surviving(srv, "draft@3 x16", flaky(5))
        assert len(calls) == 1  # a dead server is not asked again
        assert str(died.value).startswith("llama-server failed during generation (draft@3 x16) (signal 9, SIGKILL)")
