"""dspark's kernel patches measured on and off with one build, side by side in one run (issue 19).

Patches 0006 (F32 vector kernel for verify batches of up to 8 tokens) and 0007 (argmax of long rows over
many blocks) each have an environment switch that restores the stock code path; with every switch set,
the build runs the stock kernels. For each switch set ("patched", "stock" = all off, then each patch off
alone) this runs the same `dspark bench` plan, one server per configuration (llama-server inherits the
environment):
- cost cells: SYNTHETIC acceptance --spec-synth-len 1 at each budget (every draft rejected: ms per token
  is the step cost t_step(k)), plain decoding alongside;
- with --lengths: budget --speedup-budget at SYNTHETIC per-position rates of each L (tune's "rates" mode,
  the seven upstream categories by default), patched and stock only: the speedup vs plain per category.
Records (provenance, flags, sha256) go to OUT/step-switches.jsonl through bench; OUT/step-switches.json
holds the medians, min-max and the ratios patched/stock.

  python scripts/step_switches.py --out DIR                                  # a 5 %-width qwen35moe pair, CPU
  python scripts/step_switches.py --manifest pair/manifest-*.json --out DIR --lengths -- -ngl 99 -ngld 99 -fa on
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from dsparkcli.bench import tune
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import ALL, PLAIN
from dsparkcli.bench.run import run_bench
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.server import split_server_args
from dsparkcli.synth.full_width import write_full_width

# each patch's off switch (the patch files say what they change)
SWITCHES = {"0006": "DSPARK_STOCK_MMVF", "0007": "DSPARK_STOCK_ARGMAX"}
# mean acceptance lengths of the upstream pair's seven categories (seeds/minicpm-v-4.7), as tune_study uses
UPSTREAM_L = (3.501, 5.098, 5.407, 5.479, 6.126, 6.687, 7.387)
PROMPT = Prompt("fixed", "synthetic", "Write a detailed, step-by-step explanation of how a hash map works.")


def switch_sets(names: list[str]) -> dict[str, dict[str, str]]:
    """name -> environment: patched (none set), stock (all set), and '<patch> off' for each patch alone."""
    sets = {"patched": {}, "stock": {v: "1" for v in SWITCHES.values()}}
    for n in names:
        sets[f"{n} off"] = {SWITCHES[n]: "1"}
    return sets


def medians_ms(res) -> dict[str, dict[str, float]]:
    """config -> ms per token (median; lo/hi: fastest and slowest rep) from a bench result's overall summaries."""
    out = {}
    for s in res.summaries:
        t = s["tok_s"]
        if s["category"] == ALL and t.get("median") and t.get("min") and t.get("max"):
            out[s["config"]] = {"median": 1000.0 / t["median"], "lo": 1000.0 / t["max"], "hi": 1000.0 / t["min"]}
    return out


def main() -> int:
    argv, extra = split_server_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, help="a full-width pair's manifest (default: write a 5 %% qwen35moe one)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budgets", nargs="+", type=int, default=[1, 3, 5, 7])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--alone", nargs="*", default=list(SWITCHES), choices=list(SWITCHES),
                    help="patches also measured off one at a time (cost cells only)")
    ap.add_argument("--lengths", nargs="*", type=float, help=f"speedup per L (no values: {UPSTREAM_L})")
    ap.add_argument("--speedup-budget", type=int, default=5)
    ap.add_argument("--speedup-n-predict", type=int, default=128)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.manifest:
        m = json.loads(args.manifest.read_text())
        target, draft = args.manifest.parent / m["target"]["file"], args.manifest.parent / m["draft"]["file"]
    else:  # the generated pair (~70 MB) goes next to the temp files, never into the records folder
        fw = write_full_width(Path(tempfile.gettempdir()) / "dspark-shared-step-cost-pair", scale=0.05,
                              qtype="Q8_0", draft_qtype="Q8_0", target_arch="qwen35moe")
        target, draft = fw.target, fw.draft
    engine = engine_mod.describe(engine_mod.resolve_engine())
    d = Draft("draft", draft)
    cost_arms = tuple(Arm(f"cost@{k}", d, k, p_min=0.0, synth_len=1.0) for k in sorted(args.budgets))
    lengths = (UPSTREAM_L if args.lengths == [] else tuple(args.lengths)) if args.lengths is not None else ()
    k_max = 15  # the upstream draft's block: the rates of L are defined at budget 15
    speed_arms = tuple(Arm(f"L{L:g}@{args.speedup_budget}", d, args.speedup_budget, p_min=0.0,
                           synth_rates=tune.synth_rates(L, k_max)[:args.speedup_budget]) for L in lengths)

    def plan(arms, n_predict):
        return BenchPlan(target=target, drafts=(d,), budgets=(), prompts=(PROMPT,), reps=args.reps, warmup=1,
                         n_predict=n_predict, ctx=2048, threads=args.threads, seed=1, ignore_eos=True,
                         extra_args=tuple(extra), explicit_arms=arms)

    jsonl = args.out / "step-switches.jsonl"
    sets = switch_sets(args.alone)
    cost: dict[str, dict] = {}
    speed: dict[str, dict] = {}
    print(f"engine {engine.bin_dir.parent.parent.name}; ms per token, median (min-max) of {args.reps} reps")
    try:
        for name, env in sets.items():
            for var in SWITCHES.values():
                os.environ.pop(var, None)
            os.environ.update(env)  # llama-server inherits it
            tag = name.replace(" ", "-")
            cost[name] = medians_ms(run_bench(engine, plan(cost_arms, args.n_predict), out=jsonl, run_id=f"cost-{tag}"))
            print(f"{name:>10}: " + "  ".join(f"{c} {v['median']:.3f} ({v['lo']:.3f}-{v['hi']:.3f})"
                                             for c, v in cost[name].items()))
            if speed_arms and name in ("patched", "stock"):
                speed[name] = medians_ms(run_bench(engine, plan(speed_arms, args.speedup_n_predict), out=jsonl,
                                                   run_id=f"speed-{tag}"))
    finally:
        for var in SWITCHES.values():
            os.environ.pop(var, None)
    rows = []
    for config in [PLAIN, *(a.name for a in cost_arms)]:
        base = cost.get("stock", {}).get(config)
        for name in sets:
            cell = cost.get(name, {}).get(config)
            if cell and base:
                rows.append({"table": "cost", "config": config, "switches": name, "ms": cell["median"],
                             "ms_range": [cell["lo"], cell["hi"]], "over_stock": cell["median"] / base["median"]})
    for name, cells in speed.items():
        plain = cells.get(PLAIN)
        for arm, L in zip(speed_arms, lengths):
            cell = cells.get(arm.name)
            if cell and plain:
                rows.append({"table": "speedup", "config": arm.name, "L": L, "switches": name, "ms": cell["median"],
                             "speedup_vs_plain": plain["median"] / cell["median"]})
    for r in rows:
        if r["table"] == "cost" and r["switches"] == "patched":
            print(f"{r['config']:>8}: patched/stock {r['over_stock']:.3f}")
        elif r["table"] == "speedup":
            print(f"{r['config']:>10} {r['switches']:>8}: {r['speedup_vs_plain']:.3f}x plain")
    (args.out / "step-switches.json").write_text(json.dumps({
        "kind": "step-switches", "engine": {"commit": engine.commit, "backend": engine.backend,
                                            "dir": engine.bin_dir.parent.parent.name},
        "target": str(target), "draft": str(draft), "reps": args.reps, "n_predict": args.n_predict,
        "switch_sets": sets, "server_args": extra, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
