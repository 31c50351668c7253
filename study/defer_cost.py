"""What a loaded draft costs a step that does not draft: plain decoding vs the same target with the draft
loaded and llama.cpp's adaptive budget held at k = 0 (a cost table where every draft loses), with patch
0005's deferred feature injection on and off (DSPARK_NO_DEFER=1), in one run of `dspark bench`'s runner
(records with provenance in OUT/defer-cost.jsonl; summary OUT/defer-cost.json). With --rounds N the
two settings alternate N times, each round a plain server and a draft server back to back, so a
machine that slows down or speeds up during the run moves both sides of a round's ratio alike; the
summary gives each setting's median ratio over the rounds with its min-max. REAL acceptance is
irrelevant here: nothing is drafted, and the outputs must equal plain decoding's.

  python -m study.defer_cost --target T.gguf --draft D.gguf --out DIR [--reps 5] [--rounds 1]
                               [--settings defer,no-defer] [-- llama-server args]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dsparkcli.bench import prompts as kit
from dsparkcli.bench import stats
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.run import run_bench
from dsparkcli.bench.summaries import ALL
from dsparkcli.budget import rule as budget
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import patches
from dsparkcli.llama.server import split_server_args


def main() -> int:
    argv, extra = split_server_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--limit", type=int, default=1, help="kit prompts per text category")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the settings this many times")
    ap.add_argument("--settings", default="defer,no-defer", help="which of defer,no-defer to run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = engine_mod.describe(engine_mod.resolve_engine())
    if not engine_mod.capabilities(engine).adaptive_budget:
        print(f"{engine.server} has no --spec-cost-table: dspark engine build (patched)", file=sys.stderr)
        return 2
    table = args.out / "never-draft.cost.txt"  # plain 1 ms a token, any draft 1000 ms a step: k = 0 always
    table.write_text(budget.format_cost_table({0: 1.0, 1: 1000.0}, 0.0, "defer_cost.py: every draft loses"))
    d = Draft("draft", args.draft)
    plan = BenchPlan(
        target=args.target,
        drafts=(d,),
        budgets=(),
        reps=args.reps,
        warmup=1,
        n_predict=args.n_predict,
        prompts=kit.select(kit.load_prompts(), ["text"], limit=args.limit),
        ctx=4096,
        seed=1,
        threads=args.threads,
        extra_args=tuple(extra),
        explicit_arms=(Arm("draft@k0", d, 1, p_min=0.0, cost_table=table),),
    )
    jsonl = args.out / "defer-cost.jsonl"
    rows = []
    settings = [x.strip() for x in args.settings.split(",") if x.strip()]
    if not settings or set(settings) - {"defer", "no-defer"}:
        print("--settings: defer, no-defer or both", file=sys.stderr)
        return 2
    for rnd in range(args.rounds):
        for setting in settings:
            defer = setting == "defer"
            with patches.switched_off(() if defer else ("0005",)):  # 0005 off: a draft decode per step
                res = run_bench(engine, plan, out=jsonl, run_id=setting if args.rounds == 1 else f"{setting}-r{rnd}")
            for s in (row.to_record() for row in res.summaries):  # the rows as JSON: what this file keeps
                if s["category"] == ALL:
                    rows.append(
                        {
                            "defer": defer,
                            "round": rnd,
                            "config": s["config"],
                            "tok_s": s["tok_s"],
                            "speedup": s.get("speedup"),
                            "identical": s.get("identical"),
                            "drafted": s.get("drafted"),
                        }
                    )
                    print(
                        f"{'deferred' if defer else 'per step':>9} r{rnd} {s['config']:>9}: "
                        f"{s['tok_s']['median']:.1f} tok/s ({s['tok_s']['min']:.1f}-{s['tok_s']['max']:.1f})  "
                        f"speedup {s.get('speedup') or 1.0:.3f}",
                        flush=True,
                    )
    paired = {}
    for setting in settings:
        ratios = [r["speedup"] for r in rows if r["defer"] == (setting == "defer") and r["config"] != "plain"]
        paired[setting] = stats.spread(ratios)
        print(
            f"{setting}: draft@k0 / plain over {len(ratios)} round(s): median {paired[setting]['median']:.3f} "
            f"({paired[setting]['min']:.3f}-{paired[setting]['max']:.3f})"
        )
    (args.out / "defer-cost.json").write_text(
        json.dumps(
            {
                "kind": "defer-cost",
                "engine": {
                    "commit": engine.commit,
                    "backend": engine.backend,
                    "dir": engine.bin_dir.parent.parent.name,
                },
                "target": str(args.target),
                "draft": str(args.draft),
                "reps": args.reps,
                "rounds": args.rounds,
                "n_predict": args.n_predict,
                "paired_speedup": paired,
                "server_args": extra,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
