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
holds the medians, min-max and the ratios patched/stock. --rounds N alternates the switch sets N times
(run ids end in -rN): one server against another varied by +-5 % on the H200, about what the patches
save, so a claim needs several rounds.

  python scripts/step_switches.py --out DIR                                  # a 5 %-width qwen35moe pair, CPU
  python scripts/step_switches.py --manifest pair/manifest-*.json --out DIR --lengths -- -ngl 99 -ngld 99 -fa on
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from dsparkcli.budget import model as tune
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import FIXED_SYNTHETIC
from dsparkcli.bench.records import PLAIN
from dsparkcli.bench.run import run_bench
from dsparkcli.bench.stats import ms_per_token
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import patches
from dsparkcli.llama.server import split_server_args
from dsparkcli.hub.registry import upstream_acceptance
from dsparkcli.synth.full_width import measurement_pair

# the kernel patches measured, each with an off switch (llama.patches.Patch.off_switch)
SWITCHES = tuple(p.number for p in patches.shipped() if p.number in ("0006", "0007") and p.off_switch)
# mean acceptance lengths of the upstream pair's seven categories (the registry's), as tune_study uses
UPSTREAM_L = tuple(upstream_acceptance().values())
PROMPT = FIXED_SYNTHETIC


def switch_sets(names: list[str]) -> dict[str, tuple[str, ...]]:
    """name -> the patches it turns off: patched (none), stock (all), and '<patch> off' for each alone."""
    sets = {"patched": (), "stock": tuple(SWITCHES)}
    for n in names:
        sets[f"{n} off"] = (n,)
    return sets


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
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every switch set this many times, alternating (ratios per round and their median)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    fw = measurement_pair(args.manifest)
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
    # round -> switch set -> config -> ms; the sets alternate within each round, so a drift of the machine
    # or a slow server lands on both sides of a ratio instead of on one
    cost: list[dict[str, dict]] = []
    speed: list[dict[str, dict]] = []
    print(f"engine {engine.bin_dir.parent.parent.name}; ms per token, median (min-max) of {args.reps} reps")
    for rnd in range(args.rounds):
        cost.append({})
        speed.append({})
        suffix = f"-r{rnd + 1}" if args.rounds > 1 else ""
        for name, off in sets.items():
            tag = name.replace(" ", "-") + suffix
            with patches.switched_off(off):  # llama-server inherits the environment
                cells = ms_per_token(run_bench(engine, plan(cost_arms, args.n_predict), out=jsonl,
                                               run_id=f"cost-{tag}").summaries)
                if speed_arms and name in ("patched", "stock"):
                    speed[rnd][name] = ms_per_token(run_bench(engine, plan(speed_arms, args.speedup_n_predict),
                                                              out=jsonl, run_id=f"speed-{tag}").summaries)
            cost[rnd][name] = cells
            print(f"{name + suffix:>13}: " + "  ".join(f"{c} {v['median']:.3f} ({v['lo']:.3f}-{v['hi']:.3f})"
                                                     for c, v in cells.items()))
    rows = []
    for rnd, by_set in enumerate(cost, 1):
        for config in [PLAIN, *(a.name for a in cost_arms)]:
            base = by_set.get("stock", {}).get(config)
            for name in sets:
                cell = by_set.get(name, {}).get(config)
                if cell and base:
                    rows.append({"table": "cost", "round": rnd, "config": config, "switches": name,
                                 "ms": cell["median"], "ms_range": [cell["lo"], cell["hi"]],
                                 "over_stock": cell["median"] / base["median"]})
    for rnd, by_set in enumerate(speed, 1):
        for name, cells in by_set.items():
            plain = cells.get(PLAIN)
            for arm, L in zip(speed_arms, lengths):
                cell = cells.get(arm.name)
                if cell and plain:
                    rows.append({"table": "speedup", "round": rnd, "config": arm.name, "L": L, "switches": name,
                                 "ms": cell["median"], "speedup_vs_plain": plain["median"] / cell["median"]})
    for config in [PLAIN, *(a.name for a in cost_arms)]:
        ratios = [r["over_stock"] for r in rows if r["table"] == "cost" and r["switches"] == "patched"
                  and r["config"] == config]
        if ratios:
            print(f"{config:>8}: patched/stock {' '.join(f'{x:.3f}' for x in ratios)}"
                  + (f"  (median {statistics.median(ratios):.3f})" if len(ratios) > 1 else ""))
    for r in rows:
        if r["table"] == "speedup":
            print(f"{r['config']:>10} {r['switches']:>8} r{r['round']}: {r['speedup_vs_plain']:.3f}x plain")
    (args.out / "step-switches.json").write_text(json.dumps({
        "kind": "step-switches", "engine": {"commit": engine.commit, "backend": engine.backend,
                                            "dir": engine.bin_dir.parent.parent.name},
        "target": str(target), "draft": str(draft), "reps": args.reps, "n_predict": args.n_predict,
        "rounds": args.rounds,
        "switch_sets": {name: {patches.off_switch(n): "1" for n in off} for name, off in sets.items()}, "server_args": extra, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
