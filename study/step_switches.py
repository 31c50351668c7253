"""dspark's CUDA patches measured on and off with one build, side by side in one run (issues 19, 32).

Patches 0006 (F32 vector kernel for verify batches of up to 8 tokens) and 0007 (argmax of long rows over
many blocks) each have an environment switch that restores the stock code path; with every switch set, the
build runs the stock code (the H200 run of issue 32 also measured an earlier 0008, CUDA graphs cached per
shape, on and off: study/results/h200/session36; its key change is gone, its counters stay). --no-graphs adds a set with
GGML_CUDA_DISABLE_GRAPHS=1 (ggml's own switch: no CUDA graphs at all), the reference for what graphs buy.
--graph-stats sets DSPARK_CUDA_GRAPH_STATS (patch 0008's counters, logged at WARN) and reads, for every bench run, the
last counter line of each context from the llama-server logs it left: graphs replayed, captured, reset and
run directly (records: OUT/graph-stats.json). For each switch set ("patched", "stock" = all off, then each patch off
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

  python -m study.step_switches --out DIR                                  # a 5 %-width qwen35moe pair, CPU
  python -m study.step_switches --manifest pair/manifest-*.json --out DIR --lengths -- -ngl 99 -ngld 99 -fa on
  python -m study.step_switches --target T.gguf --draft D.gguf --no-graphs --graph-stats \
      --out DIR -- -ngl 99 -ngld 99 -fa on                                  # a real pair's step costs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from dsparkcli import config
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import FIXED_SYNTHETIC
from dsparkcli.bench.records import PLAIN
from dsparkcli.bench.run import run_bench
from dsparkcli.bench.stats import ms_per_token
from dsparkcli.budget import model as tune
from dsparkcli.hub.registry import upstream_acceptance
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import patches
from dsparkcli.llama.server import split_server_args
from dsparkcli.synth.full_width import measurement_pair

# the CUDA patches that can be measured, each with an off switch (llama.patches.Patch.off_switch)
MEASURABLE = tuple(p.number for p in patches.shipped() if p.number in ("0006", "0007") and p.off_switch)
NO_GRAPHS = "no graphs"  # the set with GGML_CUDA_DISABLE_GRAPHS=1 (every patch on)
_STATS = re.compile(
    r"dspark-cuda-graphs: ctx (\S+) computes (\d+) launched (\d+) captured (\d+) resets (\d+) "
    r"direct (\d+) graphs (\d+)"
)
# mean acceptance lengths of the upstream pair's seven categories (the registry's), as tune_study uses
UPSTREAM_L = tuple(upstream_acceptance().values())
PROMPT = FIXED_SYNTHETIC


def switch_sets(measured: list[str], alone: list[str], no_graphs: bool = False) -> dict[str, tuple[str, ...]]:
    """name -> the patches it turns off: patched (none), stock (every measured one), '<patch> off' for each
    alone, and (no_graphs) the patched build without CUDA graphs."""
    sets = {"patched": (), "stock": tuple(measured)}
    for n in alone:
        sets[f"{n} off"] = (n,)
    if no_graphs:
        sets[NO_GRAPHS] = ()
    return sets


def graph_counters(logs: list[Path]) -> list[dict]:
    """Each llama-server log's last counter line per CUDA context (patch 0008's DSPARK_CUDA_GRAPH_STATS)."""
    out = []
    for log in logs:
        last: dict[str, dict] = {}
        for m in _STATS.finditer(log.read_text(errors="replace")):
            last[m.group(1)] = dict(
                zip(("computes", "launched", "captured", "resets", "direct", "graphs"), map(int, m.groups()[1:]))
            )
        out.extend({"log": log.name, "ctx": i, **c} for i, c in enumerate(last.values()))
    return out


def new_logs(since: float) -> list[Path]:
    folder = config.cache_dir() / "logs"
    return sorted(
        (p for p in folder.glob("llama-server-*.log") if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime
    )


def main() -> int:
    argv, extra = split_server_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, help="a full-width pair's manifest (default: write a 5 %% qwen35moe one)")
    ap.add_argument("--target", type=Path, help="a real pair's target (with --draft) instead of a full-width pair")
    ap.add_argument("--draft", type=Path)
    ap.add_argument(
        "--patches",
        nargs="+",
        default=list(MEASURABLE),
        choices=list(MEASURABLE),
        help="the patches measured: 'stock' turns these off",
    )
    ap.add_argument("--no-graphs", action="store_true", help="also the patched build with GGML_CUDA_DISABLE_GRAPHS=1")
    ap.add_argument("--graph-stats", action="store_true", help="patch 0008's counters from every server's log")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budgets", nargs="+", type=int, default=[1, 3, 5, 7])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument(
        "--alone",
        nargs="*",
        default=[],
        choices=list(MEASURABLE),
        help="patches also measured off one at a time (cost cells only)",
    )
    ap.add_argument("--lengths", nargs="*", type=float, help=f"speedup per L (no values: {UPSTREAM_L})")
    ap.add_argument("--speedup-budget", type=int, default=5)
    ap.add_argument("--speedup-n-predict", type=int, default=128)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every switch set this many times, alternating (ratios per round and their median)",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.target is not None:
        if args.draft is None:
            ap.error("--target needs --draft")
        target, draft = args.target, args.draft
    else:
        fw = measurement_pair(args.manifest)
        target, draft = fw.target, fw.draft
    if args.graph_stats:
        os.environ["DSPARK_CUDA_GRAPH_STATS"] = "1"
    engine = engine_mod.describe(engine_mod.resolve_engine())
    d = Draft("draft", draft)
    cost_arms = tuple(Arm(f"cost@{k}", d, k, p_min=0.0, synth_len=1.0) for k in sorted(args.budgets))
    lengths = (UPSTREAM_L if args.lengths == [] else tuple(args.lengths)) if args.lengths is not None else ()
    k_max = 15  # the upstream draft's block: the rates of L are defined at budget 15
    speed_arms = tuple(
        Arm(
            f"L{L:g}@{args.speedup_budget}",
            d,
            args.speedup_budget,
            p_min=0.0,
            synth_rates=tune.synth_rates(L, k_max)[: args.speedup_budget],
        )
        for L in lengths
    )

    def plan(arms, n_predict, with_plain=True):
        return BenchPlan(
            target=target,
            drafts=(d,),
            budgets=(),
            prompts=(PROMPT,),
            reps=args.reps,
            warmup=1,
            n_predict=n_predict,
            ctx=2048,
            threads=args.threads,
            seed=1,
            ignore_eos=True,
            extra_args=tuple(extra),
            explicit_arms=arms,
            with_plain=with_plain,
        )

    jsonl = args.out / "step-switches.jsonl"
    sets = switch_sets(args.patches, args.alone, args.no_graphs)
    stats: list[dict] = []
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
            if name == NO_GRAPHS:
                os.environ["GGML_CUDA_DISABLE_GRAPHS"] = "1"
            cells: dict[str, dict] = {}
            try:
                with patches.switched_off(off):  # llama-server inherits the environment
                    for arm in cost_arms if args.graph_stats else (None,):
                        # with --graph-stats one bench run per arm, so each server's log is that arm's
                        arms = cost_arms if arm is None else (arm,)
                        t0 = time.time()
                        first = arm is None or arm == cost_arms[0]  # plain once per set
                        got = ms_per_token(
                            run_bench(
                                engine,
                                plan(arms, args.n_predict, first),
                                out=jsonl,
                                run_id=f"cost-{tag}" + ("" if arm is None else f"-{arm.name}"),
                            ).summaries
                        )
                        cells.update(got)
                        if args.graph_stats:
                            stats.append(
                                {
                                    "round": rnd + 1,
                                    "switches": name,
                                    "configs": ([PLAIN] if first else []) + [a.name for a in arms],
                                    "servers": graph_counters(new_logs(t0)),
                                }
                            )
                    if speed_arms and name in ("patched", "stock"):
                        speed[rnd][name] = ms_per_token(
                            run_bench(
                                engine, plan(speed_arms, args.speedup_n_predict), out=jsonl, run_id=f"speed-{tag}"
                            ).summaries
                        )
            finally:
                os.environ.pop("GGML_CUDA_DISABLE_GRAPHS", None)
            cost[rnd][name] = cells
            print(
                f"{name + suffix:>13}: "
                + "  ".join(f"{c} {v['median']:.3f} ({v['lo']:.3f}-{v['hi']:.3f})" for c, v in cells.items())
            )
    rows = []
    for rnd, by_set in enumerate(cost, 1):
        for arm_name in [PLAIN, *(a.name for a in cost_arms)]:
            base = by_set.get("stock", {}).get(arm_name)
            for name in sets:
                cell = by_set.get(name, {}).get(arm_name)
                if cell and base:
                    rows.append(
                        {
                            "table": "cost",
                            "round": rnd,
                            "config": arm_name,
                            "switches": name,
                            "ms": cell["median"],
                            "ms_range": [cell["lo"], cell["hi"]],
                            "over_stock": cell["median"] / base["median"],
                        }
                    )
    for rnd, by_set in enumerate(speed, 1):
        for name, cells in by_set.items():
            plain = cells.get(PLAIN)
            for arm, L in zip(speed_arms, lengths):
                cell = cells.get(arm.name)
                if cell and plain:
                    rows.append(
                        {
                            "table": "speedup",
                            "round": rnd,
                            "config": arm.name,
                            "L": L,
                            "switches": name,
                            "ms": cell["median"],
                            "speedup_vs_plain": plain["median"] / cell["median"],
                        }
                    )
    for arm_name in [PLAIN, *(a.name for a in cost_arms)]:
        ratios = [
            r["over_stock"]
            for r in rows
            if r["table"] == "cost" and r["switches"] == "patched" and r["config"] == arm_name
        ]
        if ratios:
            print(
                f"{arm_name:>8}: patched/stock {' '.join(f'{x:.3f}' for x in ratios)}"
                + (f"  (median {statistics.median(ratios):.3f})" if len(ratios) > 1 else "")
            )
    for r in rows:
        if r["table"] == "speedup":
            print(f"{r['config']:>10} {r['switches']:>8} r{r['round']}: {r['speedup_vs_plain']:.3f}x plain")
    (args.out / "step-switches.json").write_text(
        json.dumps(
            {
                "kind": "step-switches",
                "engine": {
                    "commit": engine.commit,
                    "backend": engine.backend,
                    "dir": engine.bin_dir.parent.parent.name,
                },
                "target": str(target),
                "draft": str(draft),
                "reps": args.reps,
                "n_predict": args.n_predict,
                "rounds": args.rounds,
                "switch_sets": {
                    name: {patches.off_switch(n): "1" for n in off}
                    | ({"GGML_CUDA_DISABLE_GRAPHS": "1"} if name == NO_GRAPHS else {})
                    for name, off in sets.items()
                },
                "server_args": extra,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    if args.graph_stats:
        (args.out / "graph-stats.json").write_text(json.dumps({"kind": "graph-stats", "runs": stats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
