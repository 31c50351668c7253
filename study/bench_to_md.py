#!/usr/bin/env python3
"""Turn gpu_sweep.py's JSONL into the BENCHMARKS.md tables. Every figure is read from a record.

    python -m study.bench_to_md study/results/h200/sweep.jsonl [more.jsonl ...] > section.md

Tables: tok/s and speedup vs plain per L x budget, best budget per upstream category, step costs and the
break-even acceptance length per budget (from the all-rejected L = 1 cells), the bound
tau * t1 / (t_verify(k+1) + t_draft(k)) and a per-accepted-token model next to the measured speedup, plain
decode vs the HBM bandwidth bound, load times, cells repeated across runs, and dspark's overhead.
Speedups are always against the plain baseline of the same run (run_id); several runs (parts of one
sweep) are merged cell by cell and each cell names its run. All acceptance here is SYNTHETIC
(llama-server --spec-synth-len on random weights).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from dsparkcli.bench.records import iter_jsonl
from dsparkcli.bench.stats import spread_of

CATEGORY_ORDER = ("general", "mmmu", "ocr", "charxiv", "mathvista", "math", "code")
COST, FULL = "cost", "full"  # gpu_sweep.py's L = 1 (all rejected) and L = k + 1 (all accepted) cells


def load(paths: list[Path]) -> list[dict[str, Any]]:
    recs = []
    for p in paths:

        def skip(n: int, _line: str, p: Path = p) -> None:
            print(f"warning: {p}:{n}: not JSON (a call cut mid-line?); skipped", file=sys.stderr)

        for n, rec in iter_jsonl(p, on_bad_line=skip):
            rec["_src"] = f"{p.name}:{n}"
            recs.append(rec)
    return recs


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


class Run:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.prov: dict[str, Any] = {}
        self.plain: dict[str, Any] | None = None
        self.configs: list[dict[str, Any]] = []
        self.load_probe: dict[str, Any] | None = None
        self.overhead: dict[str, Any] | None = None
        self.skipped: list[str] = []
        self.errors: list[dict[str, Any]] = []
        self.replicates: list[dict[str, Any]] = []

    @property
    def short(self) -> str:
        return self.run_id[-6:]

    def t1(self, n: str) -> float | None:
        if not self.plain or n not in self.plain["by_n_predict"]:
            return None
        return self.plain["by_n_predict"][n]["t_step_ms"]["median"]

    def t_verify(self, m: int) -> float | None:
        return (self.plain or {}).get("verify_cost_ms", {}).get(str(m))

    def t_draft(self, k: int, n: str) -> float | None:
        vals = [
            c["by_n_predict"][n]["t_draft_ms"]["median"]
            for c in self.configs
            if c["budget"] == k and n in c["by_n_predict"] and c["by_n_predict"][n].get("t_draft_ms", {}).get("median")
        ]
        return statistics.median(vals) if vals else None


def group(recs: list[dict[str, Any]]) -> tuple[dict[str, Run], list[dict[str, Any]], list[dict[str, Any]]]:
    runs: dict[str, Run] = {}
    hbm = []
    for r in recs:
        if r.get("type") == "hbm":
            hbm.append(r)
            continue
        run = runs.setdefault(r["run_id"], Run(r["run_id"]))
        t = r.get("type")
        if t == "provenance":
            run.prov = r
        elif t == "config" and "load_round" in r:  # a load-to-load replicate study (gpu_sweep.py --loads)
            run.replicates.append(r)
        elif t == "config" and r.get("budget") is None:
            run.plain = r
        elif t == "config":
            run.configs.append(r)
        elif t == "load_probe":
            run.load_probe = r
        elif t == "overhead":
            run.overhead = r
        elif t == "skipped":
            run.skipped += r.get("configs", [])
        elif t == "error":
            run.errors.append(r)
    replicates = [r for v in runs.values() for r in v.replicates]
    return {k: v for k, v in runs.items() if v.plain is not None}, hbm, replicates


def replicate_table(reps: list[dict[str, Any]], runs: dict[str, Run]) -> list[str]:
    """Load-to-load variation: the same configuration in several server loads (interleaved rounds), each
    ratio against the plain load of its own round; next to it the value the main sweep recorded."""
    out: list[str] = []
    if not reps:
        return out
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in reps:
        for n, s in r["by_n_predict"].items():
            by_key.setdefault((r["config"], n), []).append(r | {"_s": s})
    out.append("\n### Load-to-load variation (SYNTHETIC acceptance)\n")
    out.append(
        "Each configuration loaded once per round, rounds interleaved (plain first in each round); a load's "
        "value is the median of its reps, its speedup is against the plain load of the same round. "
        "Main sweep loads: the same cell in every sweep run given (earlier sessions included), in run order. "
        "Spread = max/min − 1 over all loads.\n"
    )
    out.append(
        "| config | n_predict | replicate loads | main sweep loads | all loads: median [min–max] | spread (all) |"
    )
    out.append("|---|---|---|---|---|---|")

    def order(kv: tuple[tuple[str, str], Any]) -> tuple:
        r = kv[1][0]  # plain first, then by L and budget as numbers
        return (r["budget"] is not None, r["synth_len"] or 0, r["budget"] or 0, int(kv[0][1]))

    for (key, n), rs in sorted(by_key.items(), key=order):
        rs = sorted(rs, key=lambda r: (r["run_id"], r["load_round"]))
        if key == "plain":
            vals = [r["_s"]["tok_s"]["median"] for r in rs]
            fmt, unit = ".1f", " tok/s"
            main = [
                run.plain["by_n_predict"][n]["tok_s"]["median"]
                for run in sorted(runs.values(), key=lambda r: r.run_id)
                if n in run.plain["by_n_predict"]
            ]
        else:
            vals = [r["_s"]["speedup_median"] for r in rs if r["_s"].get("speedup_median")]
            fmt, unit = ".2f", "×"
            main = [
                c["by_n_predict"][n]["speedup_median"]
                for run in sorted(runs.values(), key=lambda r: r.run_id)
                for c in run.configs
                if c["config"] == key and n in c["by_n_predict"] and c["by_n_predict"][n].get("speedup_median")
            ]
        every = vals + main
        if not every:
            continue
        sp = spread_of(every)
        out.append(
            f"| {key} | {n} | "
            + (", ".join(format(v, fmt) for v in vals) or "–")
            + " | "
            + (", ".join(format(v, fmt) for v in main) or "–")
            + f" | {sp.median:{fmt}}{unit} [{sp.min:{fmt}}–{sp.max:{fmt}}] ({len(every)} loads) "
            f"| {sp.max / sp.min - 1:.1%} |"
        )
    return out


def cells(runs: dict[str, Run], n: str) -> dict[tuple[float, int], tuple[Run, dict[str, Any]]]:
    """(L, budget) -> (run, config record) for the spec cells with a speedup at n_predict n (the L = 1 cost
    cells excluded); a later run's cell replaces an earlier one's."""
    out = {}
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        for c in run.configs:
            if c["category"] == COST:
                continue
            if n in c["by_n_predict"] and c["by_n_predict"][n].get("speedup_median") is not None:
                out[(c["synth_len"], c["budget"])] = (run, c)
    return out


def cost_cells(runs: dict[str, Run]) -> dict[int, tuple[Run, dict[str, Any], dict[str, Any]]]:
    """budget -> (run, L = 1 config record, its by_n_predict entry): every draft rejected, so each step yields
    one token and its time is the step cost t_verify(k+1) + t_draft(k) with one sampled position."""
    out = {}
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        for c in run.configs:
            if c["category"] == COST and c["by_n_predict"]:
                n = min(c["by_n_predict"], key=int)
                out[c["budget"]] = (run, c, c["by_n_predict"][n])
    return out


def t1_of(run: Run) -> float | None:
    """A run's plain ms/token at its smallest n_predict (per-step costs do not depend on n_predict)."""
    ns = sorted(run.plain["by_n_predict"], key=int) if run.plain else []
    return run.t1(ns[0]) if ns else None


def per_token_cost(runs: dict[str, Run], n_values: list[str]) -> tuple[float | None, int]:
    """Least-squares s (through 0) in  t_step(k, tau) = t_step(L=1, k) + (tau - 1) * s  over every spec cell:
    what each accepted token adds to a step (the target samples one more position, the server emits one more
    token). Returns (s in ms, cells used)."""
    cost = cost_cells(runs)
    xs, ys = [], []
    for n in n_values:
        for _run, c in cells(runs, n).values():
            s = c["by_n_predict"][n]
            tau, step = s.get("mean_len", {}).get("median"), s["t_step_ms"]["median"]
            if c["budget"] in cost and tau and step:
                xs.append(tau - 1)
                ys.append(step - cost[c["budget"]][2]["t_step_ms"]["median"])
    den = sum(x * x for x in xs)
    return (sum(x * y for x, y in zip(xs, ys)) / den if den else None), len(xs)


def _row_label(c: dict[str, Any]) -> str:
    return "(all accepted)" if c["category"] == FULL else c["category"]


def render(recs: list[dict[str, Any]]) -> str:
    runs, hbm, replicates = group(recs)
    if not runs:
        if replicates:  # a replicate study on its own: its table needs no sweep
            return "\n".join(replicate_table(replicates, {})) + "\n"
        return "No completed runs (no plain baseline record) in the input.\n"
    L: list[str] = []
    w = L.append
    any_run = next(iter(runs.values()))
    man = any_run.prov.get("manifest", {})
    w(
        "> **All acceptance below is SYNTHETIC**: random-weight pair, acceptance emulated by llama-server's "
        "`--spec-synth-len L` (geometric per-position rates with mean tokens per step L). Output text is not valid.\n"
    )
    w("### Runs (provenance)\n")
    w("| run | engine commit (backend) | GPU | dspark | target (arch, type) | target sha256 | draft sha256 | plan |")
    w("|---|---|---|---|---|---|---|---|")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        p = run.prov
        m = p.get("manifest", {})
        files = p.get("files", {})
        plan = p.get("plan", {})
        w(
            f"| `{run.run_id}` | {p.get('engine', {}).get('commit', '?')} ({p.get('engine', {}).get('backend', '?')}) "
            f"| {p.get('gpu', {}).get('name', '?')} | {p.get('dspark_version', '?')} "
            f"| {m.get('target_arch', '?')}, {m.get('qtype', '?')} (draft {m.get('draft_qtype', m.get('qtype', '?'))}), scale {m.get('scale', '?')} "
            f"| `{files.get('target', {}).get('sha256', '?')[:16]}…` | `{files.get('draft', {}).get('sha256', '?')[:16]}…` "
            f"| n_predict {plan.get('n_predict')}, reps {plan.get('reps')}, part {plan.get('part')}/{plan.get('parts')} |"
        )
    if man:
        t = man.get("target", {})
        w(
            f"\nTarget stand-in: `{man.get('target_arch')}` — {man.get('target_arch_reason', '')}. "
            f"{t.get('params_total', 0) / 1e9:.2f} B parameters, {t.get('params_active', 0) / 1e9:.2f} B active per token, "
            f"{t.get('bytes', 0) / 1e9:.2f} GB file, {t.get('bytes_active_per_token', 0) / 1e9:.3f} GB of weights read per token.\n"
        )

    n_values = sorted({n for r in runs.values() for n in r.plain["by_n_predict"]}, key=int)
    budgets = sorted({c["budget"] for r in runs.values() for c in r.configs})
    Ls = sorted({c["synth_len"] for r in runs.values() for c in r.configs if c["category"] != COST})
    label_of = {c["synth_len"]: _row_label(c) for r in runs.values() for c in r.configs if c["category"] != COST}
    category_Ls = [Lv for Lv in Ls if label_of[Lv] != _row_label({"category": FULL})]
    s_tok, s_cells = per_token_cost(runs, n_values)
    cost = cost_cells(runs)

    w("### Plain decoding (baseline of each run)\n")
    w("| run | n_predict | tok/s median [min–max] | t1 = ms/token | load s (mode) |")
    w("|---|---|---|---|---|")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        for n in n_values:
            s = run.plain["by_n_predict"].get(n)
            if s:
                ts = s["tok_s"]
                w(
                    f"| `{run.short}` | {n} | {_f(ts['median'], '.1f')} [{_f(ts['min'], '.1f')}–{_f(ts['max'], '.1f')}] "
                    f"| {_f(s['t_step_ms']['median'], '.3f')} | {_f(run.plain['load_s'], '.1f')} ({run.plain['load_mode']}) |"
                )
    if hbm:
        bws = [h["gb_per_s"]["median"] for h in hbm if h.get("gb_per_s")]
        active = man.get("target", {}).get("bytes_active_per_token")
        if bws and active:
            bws_spread = spread_of(bws)
            bw = bws_spread.median
            bound = bw * 1e9 / active
            plains = [
                (r, n, r.plain["by_n_predict"][n]["tok_s"]["median"])
                for r in sorted(runs.values(), key=lambda r: r.run_id)
                for n in n_values
                if n in r.plain["by_n_predict"]
            ]
            w(
                f"\n**Plain decoding vs the HBM bandwidth bound.** Device-to-device copy: {bw:.0f} GB/s (median of {len(bws)} "
                f"`hbm` records, {bws_spread.min:.0f}–{bws_spread.max:.0f}; torch on {hbm[0].get('device', '?')}, bytes read + written). "
                f"Active weights read per token: {active / 1e9:.3f} GB ⇒ bound {bound:.0f} tok/s ({active / bw / 1e6:.3f} ms/token). "
                f"Measured plain decoding: {min(p[2] for p in plains):.1f}–{max(p[2] for p in plains):.1f} tok/s over "
                f"{len(plains)} run × n_predict baselines = {min(p[2] for p in plains) / bound:.1%}–{max(p[2] for p in plains) / bound:.1%} of the bound.\n"
            )
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        if run.load_probe:
            lp = run.load_probe
            w(
                f"\nLoad probe (run `{run.short}`): "
                + ", ".join(f"`-lm {k}` {v:.1f} s" for k, v in lp["load_s"].items())
                + f" for a {lp['target_bytes'] / 1e9:.1f} GB target from page cache; the sweep used `{lp['chosen']}`.\n"
            )

    if cost:
        w("\n### Step cost per budget and break-even acceptance length (SYNTHETIC acceptance)\n")
        w(
            "t_step(L=1): ms per step in the all-rejected cell of budget k — the target verifies k+1 tokens, the draft "
            "proposes k, one token comes out — i.e. t_verify(k+1) + t_draft(k). t_draft: draft ms per call from "
            "llama-server's speculative statistics in the same cell. t1: plain ms/token of the same run. "
            + (
                f"s = {s_tok:.3f} ms: what each accepted token adds to a step (least squares over {s_cells} spec cells of "
                "t_step − t_step(L=1) against τ − 1: one more sampled position of the 248k-entry vocabulary, one more "
                "emitted token). "
                if s_tok is not None
                else ""
            )
            + "Break-even L: the mean tokens per step at which a budget only matches plain decoding; "
            "t_step(L=1)/t1 ignores s, (t_step(L=1) − s)/(t1 − s) solves τ·t1 = t_step(L=1) + (τ−1)·s.\n"
        )
        w(
            "| k | t_step(L=1) ms | t_draft ms | t_verify(k+1) ms | t1 ms | break-even L = t_step(L=1)/t1 | break-even L with s "
            + "".join(f"| t_step in spec cells, n {n} (median, cells) " for n in n_values)
            + "| record |"
        )
        w("|---|---|---|---|---|---|---|" + "---|" * len(n_values) + "---|")
        for k in sorted(cost):
            run, c, st = cost[k]
            step, draft, t1 = st["t_step_ms"]["median"], st.get("t_draft_ms", {}).get("median"), t1_of(run)
            if not (step and t1):
                continue
            verify = step - draft if draft is not None else None
            be_s = (step - s_tok) / (t1 - s_tok) if s_tok is not None and t1 > s_tok else None
            spec_cols = []
            for n in n_values:
                steps = [
                    cc["by_n_predict"][n]["t_step_ms"]["median"]
                    for (Lv, kk), (_, cc) in cells(runs, n).items()
                    if kk == k
                ]
                spec_cols.append(f"{statistics.median(steps):.2f} ({len(steps)})" if steps else "–")
            w(
                f"| {k} | {step:.2f} | {_f(draft)} | {_f(verify)} | {t1:.3f} | {step / t1:.2f} | {_f(be_s)} | "
                + " | ".join(spec_cols)
                + f" | `{run.short}` {c['config']} |"
            )

    for n in n_values:
        grid = cells(runs, n)
        if not grid:
            continue
        w(f"\n### Speedup vs plain, n_predict {n} (SYNTHETIC acceptance)\n")
        w(
            "Median speedup [min–max over reps] and median tok/s, against the plain baseline of the same run; "
            '`–`: not run (llama.cpp requires L ≤ k+1). "(all accepted)" rows: L = k+1 for budgets that no upstream '
            "category's L fits, i.e. the most those budgets can give.\n"
        )
        w("| category | L | " + " | ".join(f"k={k}" for k in budgets) + " |")
        w("|---|---|" + "---|" * len(budgets))
        for Lv in Ls:
            row = []
            for k in budgets:
                hit = grid.get((Lv, k))
                if hit:
                    s = hit[1]["by_n_predict"][n]
                    row.append(
                        f"**{s['speedup_median']:.2f}×** [{s['speedup_min']:.2f}–{s['speedup_max']:.2f}] {s['tok_s']['median']:.0f} t/s"
                    )
                else:
                    row.append("–")
            w(f"| {label_of.get(Lv, '?')} | {Lv:g} | " + " | ".join(row) + " |")

        w(f"\n#### Best budget per upstream category (n_predict {n})\n")
        w("| category | upstream L | best k | speedup [min–max] | tok/s | measured mean len | runner-up | record |")
        w("|---|---|---|---|---|---|---|---|")
        for Lv in category_Ls:
            options = sorted(
                ((k, grid[(Lv, k)]) for k in budgets if (Lv, k) in grid),
                key=lambda o: -o[1][1]["by_n_predict"][n]["speedup_median"],
            )
            if not options:
                continue
            k, (run, c) = options[0]
            s = c["by_n_predict"][n]
            second = (
                f"k={options[1][0]} {options[1][1][1]['by_n_predict'][n]['speedup_median']:.2f}×"
                if len(options) > 1
                else "–"
            )
            w(
                f"| {c['category']} | {Lv:g} | {k} | {s['speedup_median']:.2f}× [{s['speedup_min']:.2f}–{s['speedup_max']:.2f}] "
                f"| {s['tok_s']['median']:.1f} | {_f(s.get('mean_len', {}).get('median'))} | {second} | `{run.short}` {c['config']} |"
            )

        if cost:
            w(f"\n#### Bound τ·t1/(t_verify(k+1)+t_draft(k)) and model vs measured speedup (n_predict {n})\n")
            w(
                "Each cell: **bound** τ·t1/t_step(L=1) · **model** τ·t1/(t_step(L=1) + (τ−1)·s) · **measured**; τ is the "
                "cell's measured mean tokens per step, t1 its run's plain ms/token, t_step(L=1) and s from the table above.\n"
            )
            w("| category | L | " + " | ".join(f"k={k}" for k in budgets) + " |")
            w("|---|---|" + "---|" * len(budgets))
            errs = []
            for Lv in Ls:
                row = []
                for k in budgets:
                    hit = grid.get((Lv, k))
                    tau = hit[1]["by_n_predict"][n].get("mean_len", {}).get("median") if hit else None
                    if not hit or k not in cost or not tau:
                        row.append("–")
                        continue
                    run, c = hit
                    t1, c_k = run.t1(n), cost[k][2]["t_step_ms"]["median"]
                    measured = c["by_n_predict"][n]["speedup_median"]
                    bound = tau * t1 / c_k
                    model = tau * t1 / (c_k + (tau - 1) * s_tok) if s_tok is not None else None
                    if model is not None:
                        errs.append(measured / model - 1)
                    row.append(f"{bound:.2f} · {_f(model)} · **{measured:.2f}**")
                w(f"| {label_of.get(Lv, '?')} | {Lv:g} | " + " | ".join(row) + " |")
            if errs:
                e = spread_of(errs)
                w(
                    f"\nMeasured vs model over {len(errs)} cells: median {e.median:+.1%}, "
                    f"range {e.min:+.1%} to {e.max:+.1%}.\n"
                )

    repeats = {}
    for n in n_values:
        for run in runs.values():
            for c in run.configs:
                if c["category"] != COST and n in c["by_n_predict"] and c["by_n_predict"][n].get("speedup_median"):
                    repeats.setdefault((c["config"], n), []).append((run, c["by_n_predict"][n]["speedup_median"]))
    repeats = {k: v for k, v in repeats.items() if len(v) > 1}
    if repeats:
        w("\n### Cells measured in more than one run\n")
        w("| config | n_predict | speedup per run |")
        w("|---|---|---|")
        for (key, n), vals in sorted(repeats.items()):
            w(
                f"| {key} | {n} | "
                + ", ".join(f"{v:.2f}× (`{r.short}`)" for r, v in sorted(vals, key=lambda x: x[0].run_id))
                + " |"
            )

    L.extend(replicate_table(replicates, runs))

    measured = {c["config"] for r in runs.values() for c in r.configs}
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        if run.overhead and "decode_ratio" in run.overhead:
            o = run.overhead
            w(
                f"\ndspark vs bare HTTP client on the plain server (run `{run.short}`, record `overhead`): decode tok/s ratio "
                f"{o['decode_ratio']:.3f}, time-to-first-token delta {o['ttft_delta_s'] * 1e3:+.1f} ms ({o['reps']} reps, {o['n_predict']} tokens).\n"
            )
        never = [x for x in run.skipped if x.split("/")[0] not in measured]  # a later call may have run it
        if never:
            w(f"\nRun `{run.short}` skipped at its deadline, and no run measured: {', '.join(never)}.\n")
        for e in run.errors:
            w(f"\nRun `{run.short}`: configuration {e['config']} failed: `{e['error'][:200]}`.\n")
    w(
        "\nSources: every cell is a field of a `config` record (`by_n_predict[n]`) of the named run in the JSONL; "
        "step costs from the L = 1 `config` records, HBM from `hbm`, load times from `load_probe`/`config.load_s`. "
        "(`verify_cost` records — prompt eval of m fresh tokens on the plain server — are kept but not used: prompt "
        "batches take another path than speculative verification on this hybrid target.)\n"
    )
    w("\n### Reproduce\n")
    w("```")
    w(
        "python -m study.lease pack --eval DIR; python -m study.lease lean   # .lease/callN: sdist, wheels, pair (carry them)"
    )
    w(
        "python3 -m study.lease start --plan study/plans/sweep.toml; python3 -m study.lease poll --plan study/plans/sweep.toml"
    )
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        argv = run.prov.get("argv")
        if argv:
            w("# run " + run.run_id + ":\npython " + " ".join(str(a) for a in argv))
    w(f"python -m study.bench_to_md {' '.join(sorted({r['_src'].split(':')[0] for r in recs}))}")
    w("```")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="JSONL from study/gpu_sweep.py -> BENCHMARKS.md tables")
    ap.add_argument("jsonl", nargs="+", type=Path)
    args = ap.parse_args(argv)
    sys.stdout.write(render(load(args.jsonl)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
