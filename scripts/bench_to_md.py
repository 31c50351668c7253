#!/usr/bin/env python3
"""Turn gpu_sweep.py's JSONL into the BENCHMARKS.md tables. Every figure is read from a record.

    python scripts/bench_to_md.py results/h200/sweep.jsonl [more.jsonl ...] > section.md

Tables: tok/s and speedup vs plain per L x budget, best budget per upstream category, break-even
acceptance length per budget, the bound  L * t1 / (t_verify(k+1) + t_draft(k))  next to the measured
speedup, step costs, plain decode vs the HBM bandwidth bound, load times, and dspark's overhead.
Speedups are always against the plain baseline of the same run (run_id); several runs (parts of one
sweep) are merged cell by cell and each cell names its run. All acceptance here is SYNTHETIC
(llama-server --spec-synth-len on random weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

CATEGORY_ORDER = ("general", "mmmu", "ocr", "charxiv", "mathvista", "math", "code")


def load(paths: list[Path]) -> list[dict[str, Any]]:
    recs = []
    for p in paths:
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                print(f"warning: {p}:{n}: not JSON (a call cut mid-line?); skipped", file=sys.stderr)
                continue
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
        vals = [c["by_n_predict"][n]["t_draft_ms"]["median"] for c in self.configs
                if c["budget"] == k and n in c["by_n_predict"] and c["by_n_predict"][n].get("t_draft_ms", {}).get("median")]
        return statistics.median(vals) if vals else None


def group(recs: list[dict[str, Any]]) -> tuple[dict[str, Run], list[dict[str, Any]]]:
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
    return {k: v for k, v in runs.items() if v.plain is not None}, hbm


def cells(runs: dict[str, Run], n: str) -> dict[tuple[float, int], tuple[Run, dict[str, Any]]]:
    """(L, budget) -> (run, config record); a later run's cell replaces an earlier one's."""
    out = {}
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        for c in run.configs:
            if n in c["by_n_predict"] and c["by_n_predict"][n].get("speedup_median") is not None:
                out[(c["synth_len"], c["budget"])] = (run, c)
    return out


def render(recs: list[dict[str, Any]]) -> str:
    runs, hbm = group(recs)
    if not runs:
        return "No completed runs (no plain baseline record) in the input.\n"
    L: list[str] = []
    w = L.append
    any_run = next(iter(runs.values()))
    man = any_run.prov.get("manifest", {})
    w("> **All acceptance below is SYNTHETIC**: random-weight pair, acceptance emulated by llama-server's "
      "`--spec-synth-len L` (geometric per-position rates with mean tokens per step L). Output text is not valid.\n")
    w("### Runs (provenance)\n")
    w("| run | engine commit (backend) | GPU | dspark | target (arch, type) | target sha256 | draft sha256 | plan |")
    w("|---|---|---|---|---|---|---|---|")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        p = run.prov
        m = p.get("manifest", {})
        files = p.get("files", {})
        plan = p.get("plan", {})
        w(f"| `{run.run_id}` | {p.get('engine', {}).get('commit', '?')} ({p.get('engine', {}).get('backend', '?')}) "
          f"| {p.get('gpu', {}).get('name', '?')} | {p.get('dspark_version', '?')} "
          f"| {m.get('target_arch', '?')}, {m.get('qtype', '?')} (draft {m.get('draft_qtype', m.get('qtype', '?'))}), scale {m.get('scale', '?')} "
          f"| `{files.get('target', {}).get('sha256', '?')[:16]}…` | `{files.get('draft', {}).get('sha256', '?')[:16]}…` "
          f"| n_predict {plan.get('n_predict')}, reps {plan.get('reps')}, part {plan.get('part')}/{plan.get('parts')} |")
    if man:
        t = man.get("target", {})
        w(f"\nTarget stand-in: `{man.get('target_arch')}` — {man.get('target_arch_reason', '')}. "
          f"{t.get('params_total', 0) / 1e9:.2f} B parameters, {t.get('params_active', 0) / 1e9:.2f} B active per token, "
          f"{t.get('bytes', 0) / 1e9:.2f} GB file, {t.get('bytes_active_per_token', 0) / 1e9:.3f} GB of weights read per token.\n")

    n_values = sorted({n for r in runs.values() for n in r.plain["by_n_predict"]}, key=int)
    budgets = sorted({c["budget"] for r in runs.values() for c in r.configs})
    Ls = sorted({c["synth_len"] for r in runs.values() for c in r.configs if c["category"] != "cost"})
    cat_of = {c["synth_len"]: c["category"] for r in runs.values() for c in r.configs}

    w("### Plain decoding (baseline of each run)\n")
    w("| run | n_predict | tok/s median [min–max] | t1 = ms/token | load s (mode) |")
    w("|---|---|---|---|---|")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        for n in n_values:
            s = run.plain["by_n_predict"].get(n)
            if s:
                ts = s["tok_s"]
                w(f"| `{run.short}` | {n} | {_f(ts['median'], '.1f')} [{_f(ts['min'], '.1f')}–{_f(ts['max'], '.1f')}] "
                  f"| {_f(s['t_step_ms']['median'], '.3f')} | {_f(run.plain['load_s'], '.1f')} ({run.plain['load_mode']}) |")
    if hbm:
        bw = statistics.median([h["gb_per_s"]["median"] for h in hbm if h.get("gb_per_s")]) if any(h.get("gb_per_s") for h in hbm) else None
        active = man.get("target", {}).get("bytes_active_per_token")
        if bw and active:
            bound = bw * 1e9 / active
            w(f"\nHBM: device copy {bw:.0f} GB/s (torch, {hbm[0].get('device', '?')}; record `hbm`). Active weights "
              f"{active / 1e9:.3f} GB/token ⇒ bandwidth bound {bound:.0f} tok/s for plain decoding; measured plain "
              + ", ".join(f"{r.plain['by_n_predict'][n]['tok_s']['median']:.1f} tok/s = {r.plain['by_n_predict'][n]['tok_s']['median'] / bound:.0%} of it (n_predict {n}, run `{r.short}`)"
                          for r in sorted(runs.values(), key=lambda r: r.run_id) for n in n_values[:1] if n in r.plain['by_n_predict'])
              + ".\n")
    for run in runs.values():
        if run.load_probe:
            lp = run.load_probe
            w(f"\nLoad probe (run `{run.short}`): " + ", ".join(f"`-lm {k}` {v:.1f} s" for k, v in lp["load_s"].items())
              + f" for a {lp['target_bytes'] / 1e9:.1f} GB target from page cache; the sweep used `{lp['chosen']}`.\n")

    for n in n_values:
        grid = cells(runs, n)
        if not grid:
            continue
        w(f"\n### Speedup vs plain, n_predict {n} (SYNTHETIC acceptance)\n")
        w("Median speedup [min–max over reps] and median tok/s; `–`: not run (budget < L−1, or skipped).\n")
        w("| category | L | " + " | ".join(f"k={k}" for k in budgets) + " |")
        w("|---|---|" + "---|" * len(budgets))
        for Lv in Ls:
            row = []
            for k in budgets:
                hit = grid.get((Lv, k))
                if hit:
                    s = hit[1]["by_n_predict"][n]
                    row.append(f"**{s['speedup_median']:.2f}×** [{s['speedup_min']:.2f}–{s['speedup_max']:.2f}] {s['tok_s']['median']:.0f} t/s")
                else:
                    row.append("–")
            w(f"| {cat_of.get(Lv, '?')} | {Lv:g} | " + " | ".join(row) + " |")

        w(f"\n#### Best budget per upstream category (n_predict {n})\n")
        w("| category | upstream L | best k | speedup [min–max] | tok/s | measured mean len | record |")
        w("|---|---|---|---|---|---|---|")
        for Lv in Ls:
            options = [(k, grid[(Lv, k)]) for k in budgets if (Lv, k) in grid]
            if not options:
                continue
            k, (run, c) = max(options, key=lambda o: o[1][1]["by_n_predict"][n]["speedup_median"])
            s = c["by_n_predict"][n]
            w(f"| {c['category']} | {Lv:g} | {k} | {s['speedup_median']:.2f}× [{s['speedup_min']:.2f}–{s['speedup_max']:.2f}] "
              f"| {s['tok_s']['median']:.1f} | {_f(s.get('mean_len', {}).get('median'))} | `{run.short}` {c['config']} |")

        w(f"\n#### Step costs and break-even acceptance length per budget (n_predict {n})\n")
        w("t1: plain ms/token. t_step: ms per verification step in the speculative runs (median over configs). "
          "t_draft: draft ms per call (llama-server speculative statistics). t_verify(k+1): prompt eval of k+1 fresh "
          "tokens on the plain server. Break-even L: measured t_step/t1 and model (t_verify+t_draft)/t1.\n")
        w("| k | t1 | t_step (measured) | t_draft | t_verify(k+1) | break-even L (measured) | break-even L (model) |")
        w("|---|---|---|---|---|---|---|")
        for k in budgets:
            t1s, steps, drafts, verifs = [], [], [], []
            for run in runs.values():
                for c in run.configs:
                    if c["budget"] == k and n in c["by_n_predict"]:
                        st = c["by_n_predict"][n]["t_step_ms"]["median"]
                        if st and run.t1(n):
                            steps.append(st)
                            t1s.append(run.t1(n))
                d, v = run.t_draft(k, n), run.t_verify(k + 1)
                if d is not None:
                    drafts.append(d)
                if v is not None:
                    verifs.append(v)
            if not steps:
                continue
            t1 = statistics.median(t1s)
            step = statistics.median(steps)
            d = statistics.median(drafts) if drafts else None
            v = statistics.median(verifs) if verifs else None
            model = (v + d) / t1 if (v is not None and d is not None) else None
            w(f"| {k} | {t1:.3f} | {step:.3f} | {_f(d, '.3f')} | {_f(v, '.3f')} | {step / t1:.2f} | {_f(model)} |")

        w(f"\n#### Bound L·t1/(t_verify(k+1)+t_draft(k)) vs measured speedup (n_predict {n})\n")
        w("| category | L | " + " | ".join(f"k={k}" for k in budgets) + " |")
        w("|---|---|" + "---|" * len(budgets))
        for Lv in Ls:
            row = []
            for k in budgets:
                hit = grid.get((Lv, k))
                if not hit:
                    row.append("–")
                    continue
                run, c = hit
                t1, v, d = run.t1(n), run.t_verify(k + 1), run.t_draft(k, n)
                bound = Lv * t1 / (v + d) if (t1 and v is not None and d is not None) else None
                row.append(f"{_f(bound)} / {c['by_n_predict'][n]['speedup_median']:.2f}")
            w(f"| {cat_of.get(Lv, '?')} | {Lv:g} | " + " | ".join(row) + " |")
        w("\n(bound / measured; the bound leaves out sampling, rollback/checkpoint restore and the server loop.)\n")

    for run in sorted(runs.values(), key=lambda r: r.run_id):
        if run.overhead and "decode_ratio" in run.overhead:
            o = run.overhead
            w(f"\ndspark vs bare HTTP client on the plain server (run `{run.short}`, record `overhead`): decode tok/s ratio "
              f"{o['decode_ratio']:.3f}, time-to-first-token delta {o['ttft_delta_s'] * 1e3:+.1f} ms ({o['reps']} reps, {o['n_predict']} tokens).\n")
        if run.skipped:
            w(f"\nRun `{run.short}` skipped at its deadline: {', '.join(run.skipped)}.\n")
        for e in run.errors:
            w(f"\nRun `{run.short}`: configuration {e['config']} failed: `{e['error'][:200]}`.\n")
    w("\nSources: every cell is a field of a `config` record (`by_n_predict[n]`) of the named run in the JSONL; "
      "t_verify from `verify_cost`, HBM from `hbm`, load times from `load_probe`/`config.load_s`.\n")
    w("\n### Reproduce\n")
    w("```")
    w(".venv/bin/python scripts/pack_gpu_bundle.py          # .gpu/: llama.cpp tarball + wheels (carry it)")
    w("bash scripts/gpu_study.sh --quick                    # on the GPU machine, repo root, $OUT set")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        argv = run.prov.get("argv")
        if argv:
            w("# run " + run.run_id + ":\npython " + " ".join(str(a) for a in argv))
    w(f"python scripts/bench_to_md.py {' '.join(sorted({r['_src'].split(':')[0] for r in recs}))}")
    w("```")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="JSONL from scripts/gpu_sweep.py -> BENCHMARKS.md tables")
    ap.add_argument("jsonl", nargs="+", type=Path)
    args = ap.parse_args(argv)
    sys.stdout.write(render(load(args.jsonl)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
