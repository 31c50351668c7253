#!/usr/bin/env python3
"""BENCHMARKS.md's REAL-pair section, rendered from the committed records (a thin client of bench.*).

    python -m study.real_to_md                      # prints the section (tests/test_benchmarks_doc.py
                                                      # checks BENCHMARKS.md holds exactly this)

Inputs: the `dspark distill --json` report of the shipped draft and `dspark bench` JSONL runs of that
draft against plain decoding (H200 CUDA engine: study/results/h200/real3/; CPU engine: study/results/real3/; the
second draft's are in study/results/h200/real2/ and study/results/real/), and, for
the first draft this pair shipped (study/results/h200/real/), the H200 `dspark bench --concurrency` run
(study/load_to_md.py renders it) and the H200 `dspark tune` record (study/tune_to_md.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from dsparkcli.bench import report, stats
from dsparkcli.bench.records import read_jsonl
from dsparkcli.budget.record import TuningRecord
from study import load_to_md, tune_to_md

ROOT = Path(__file__).resolve().parent.parent

DISTILL = ROOT / "study/results/h200/real3/distill-report.json"
LOAD = ROOT / "study/results/h200/real/load-real.jsonl"
TUNE = ROOT / "study/results/h200/real/tune/tune.json"
BENCHES = {
    "H200 (CUDA sm_90)": ROOT / "study/results/h200/real3/bench-h200.jsonl",
    "CPU (2 cores)": ROOT / "study/results/real3/bench-cpu.jsonl",
}
REPLAYS = {
    "H200 (CUDA sm_90)": ROOT / "study/results/h200/real3/replay-h200.json",
    "CPU (2 cores)": ROOT / "study/results/real3/replay-cpu.json",
}
TRANSFER = ROOT / "study/results/real3/transfer-code.json"
FIRST_DRAFT = "the first draft, sha256 `28cbc2a667e537d1…`"


def _records(path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(path))


def distill_section(rep: dict[str, Any]) -> list[str]:
    d, t = rep["data"], rep["training"]
    o = t["options"]
    best = t["best"]
    lines = [
        "### The distill run (`dspark distill`, REAL)",
        "",
        f"- target sha256 `{rep['target_sha256'][:16]}…`, device {rep['device']}; draft `{Path(rep['out']).name}` "
        f"{rep['out_bytes']:,} bytes, sha256 `{rep['out_sha256'][:16]}…`",
        f"- draft: {t['config']['n_layer']} layers, block size {t['config']['block_size']}, taps "
        f"{t['config']['taps']} (layer inputs), Markov rank {t['config']['markov_rank']}, mask token "
        f"{t['config']['mask_token_id']}",
        f"- data: {d['sequences']:,} sequences ({d['templated_prompts']:,} templated prompts and "
        f"{d['self_written_questions']:,} questions the target wrote, {d['dropped_as_eval']} dropped as kit "
        f"look-alikes; generation stopped by `--data-minutes`), {d['response_tokens']:,} response tokens, "
        f"responses up to {d['max_new']} tokens",
        f"- training: {t['steps']:,} steps of {o['batch']} sequences x {o['anchors']} blocks in "
        f"{t['seconds']:.0f} s (`--minutes {o['minutes']:g}`), lr {o['lr']:g}"
        + (f", soft-label weight {o['soft_weight']:g} (top-{o['soft_k']})" if o.get("soft_weight") else "")
        + "; loss "
        + " → ".join(f"{loss:.2f}" for _, loss in t["losses"]),
        f"- best held-out evaluation at step {best['step']:,} ({best['seconds']:.0f} s); simulated mean acceptance "
        + (
            f"length on {t['val_sequences']} sequences of {o['val_groups']} prompt templates per category that "
            "were held out whole (never trained on), per budget:"
            if o.get("val_groups")
            else "length on 3 % held-out training sequences (same templates, so optimistic), per budget:"
        ),
        "",
        "| category | " + " | ".join(f"k={k + 1}" for k in range(len(next(iter(best["tau"].values()))))) + " |",
        "|---" * (1 + len(next(iter(best["tau"].values())))) + "|",
    ]
    lines += [f"| {cat} | " + " | ".join(f"{v:.2f}" for v in tau) + " |" for cat, tau in sorted(best["tau"].items())]
    return lines + [""]


def step_costs(recs: list[dict[str, Any]]) -> list[str]:
    """t1 (plain ms/token), t_step(k) = generation ms / verification steps, and the break-even τ = t_step/t1."""
    gen: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])  # (config, cat) -> [ms, tokens]
    steps: dict[tuple[str, str], int] = defaultdict(int)
    budget: dict[str, int] = {}
    for r in recs:
        if r["record"] == "request":
            gen[(r["config"], r["category"])][0] += r["predicted_ms"]
            gen[(r["config"], r["category"])][1] += r["n_predicted"]
            if r.get("budget"):
                budget[r["config"]] = r["budget"]
        elif r["record"] == "counters":
            steps[(r["config"], r["category"])] += r["steps"]
    rows = [
        "| config | category | t1 plain (ms/token) | t_step (ms) | break-even τ | measured τ | bound τ·t1/t_step | measured speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summaries = {(s.config, s.category): s.to_record() for s in stats.summarize(recs)}
    for (config, cat), (ms, _n) in sorted(gen.items(), key=lambda kv: (budget.get(kv[0][0], 0), kv[0][1])):
        if config == "plain" or not steps[(config, cat)]:
            continue
        p_ms, p_n = gen[("plain", cat)]
        t1 = p_ms / p_n
        t_step = ms / steps[(config, cat)]
        s = summaries.get((config, cat), {})
        tau = s.get("mean_length")
        speed = s.get("speedup")
        rows.append(
            f"| {config} | {cat} | {t1:.3f} | {t_step:.3f} | {t_step / t1:.2f} | "
            f"{tau:.2f} | {tau * t1 / t_step:.2f}× | {speed:.2f}× |"
            if tau and speed
            else f"| {config} | {cat} | {t1:.3f} | {t_step:.3f} | {t_step / t1:.2f} | - | - | - |"
        )
    return rows


def _flags(argv: list[str]) -> str:
    """llama-server's flags without the binary, the address and the machine's file paths."""
    out, skip = [], {"--host", "--port", "-m", "-md", "--mmproj"}
    it = iter(argv[1:])
    for a in it:
        if a in skip:
            next(it, None)
            continue
        out.append(a)
    return " ".join(out)


def bench_section(label: str, path: Path) -> list[str]:
    recs = _records(path)
    run_ids = sorted({r.get("run_id") for r in recs if r.get("run_id")})
    prov = next(r["provenance"] for r in recs if r.get("provenance"))
    eng = prov["engine"]
    summaries = stats.summarize(recs)
    lines = [
        f"### {label}: plain vs the shipped draft (REAL acceptance)",
        "",
        f"`{path.relative_to(ROOT)}`, run {', '.join(run_ids)}; engine {eng['commit']} {eng['backend']}, "
        f"GPU {prov['gpu']}; n_predict {prov['n_predict']}, {prov['reps']} reps, greedy; flags "
        f"`{_flags(next(r['server_argv'] for r in recs if r['record'] == 'counters'))}`",
        "",
        report.to_markdown(summaries).rstrip("\n"),
        "",
        "Step cost and the bound (plain's t1 from the same run):",
        "",
        *step_costs(recs),
        "",
    ]
    return lines


def replay_section() -> list[str]:
    """study/kit_replay.py's records: the engine's counts next to the torch draft's on the same tokens."""
    lines = [
        "### The same runs replayed by the torch draft (study/kit_replay.py)",
        "",
        "Mean acceptance length per cell: llama-server's (its counters) / the torch draft's in the server's "
        "loop on the same output tokens (accepted tokens in brackets).",
        "",
    ]
    docs = {label: json.loads(path.read_text(encoding="utf-8")) for label, path in REPLAYS.items() if path.is_file()}
    for label, doc in docs.items():
        lines += [
            f"{label}: `{REPLAYS[label].relative_to(ROOT)}` (bench sha256 `{doc['bench']['sha256'][:12]}…`, "
            f"draft `{doc['draft']['sha256'][:12]}…`, torch {doc['torch']} on the CPU)",
            "",
            "| budget | " + " | ".join(c for c in ("math", "code", "general", "all")) + " |",
            "|---|---|---|---|---|",
        ]
        cells = {(r["category"], r["budget"]): r for r in doc["summary"]}
        for budget in sorted({b for _, b in cells}):
            row = []
            for cat in ("math", "code", "general", "all"):
                r = cells.get((cat, budget))
                row.append(
                    "–"
                    if r is None or r["engine_mean_length"] is None
                    else f"{r['engine_mean_length']:.3f} / {r['mean_length']:.3f} "
                    f"({r['engine_accepted']} / {r['accepted']})"
                )
            lines.append(f"| {budget} | " + " | ".join(row) + " |")
        lines.append("")
    if TRANSFER.is_file():
        doc = json.loads(TRANSFER.read_text(encoding="utf-8"))
        lines += [
            f"Transfer to unseen code tasks (`{TRANSFER.relative_to(ROOT)}`, study/draft_transfer.py; torch "
            f"replay at budget {doc['budget']}, {doc['n_predict']} greedy tokens per prompt):",
            "",
            "| prompt set | prompts | mean acceptance length | per prompt min-median-max |",
            "|---|---|---|---|",
        ]
        for r in doc["summary"]:
            lines.append(
                f"| {r['set']} | {r['prompts']} | {r['mean_length']:.3f} | {r['per_prompt_min']:.2f}-"
                f"{r['per_prompt_median']:.2f}-{r['per_prompt_max']:.2f} |"
            )
        lines.append("")
    return lines


def render() -> str:
    rep = json.loads(DISTILL.read_text(encoding="utf-8"))
    out = distill_section(rep)
    for label, path in BENCHES.items():
        if path.is_file() and any(r["record"] == "overhead" for r in _records(path)):  # a finished run only
            out += bench_section(label, path)
    out += replay_section()
    if LOAD.is_file():
        text = load_to_md.section(LOAD).replace(f"{ROOT}/", "")
        out += [
            f"### H200: many users at once (`dspark bench --concurrency`, REAL acceptance; {FIRST_DRAFT})",
            "",
            text.rstrip("\n"),
            "",
        ]
    if TUNE.is_file():
        rec = TuningRecord.from_record(json.loads(TUNE.read_text(encoding="utf-8")))
        out += [
            f"### H200: `dspark tune` on the real pair (REAL acceptance; {FIRST_DRAFT})",
            "",
            tune_to_md.record_md(rec, str(TUNE.relative_to(ROOT))).rstrip("\n"),
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
