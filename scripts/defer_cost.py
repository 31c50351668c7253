"""What a loaded draft costs a step that does not draft: plain decoding vs the same target with the draft
loaded and llama.cpp's adaptive budget held at k = 0 (a cost table where every draft loses), with patch
0005's deferred feature injection on and off (DSPARK_NO_DEFER=1), in one run of `dspark bench`'s runner
(records with provenance in OUT/defer-cost.jsonl; summary OUT/defer-cost.json). REAL acceptance is
irrelevant here: nothing is drafted, and the outputs must equal plain decoding's.

  python scripts/defer_cost.py --target T.gguf --draft D.gguf --out DIR [--reps 5] [-- llama-server args]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dsparkcli.bench import prompts as kit
from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.records import ALL
from dsparkcli.bench.run import run_bench
from dsparkcli.llama import budget, engine as engine_mod, patches
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
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = engine_mod.describe(engine_mod.resolve_engine())
    if not engine_mod.capabilities(engine).adaptive_budget:
        print(f"{engine.server} has no --spec-cost-table: dspark engine build (patched)", file=sys.stderr)
        return 2
    table = args.out / "never-draft.cost.txt"  # plain 1 ms a token, any draft 1000 ms a step: k = 0 always
    table.write_text(budget.format_cost_table({0: 1.0, 1: 1000.0}, 0.0, "defer_cost.py: every draft loses"))
    d = Draft("draft", args.draft)
    plan = BenchPlan(target=args.target, drafts=(d,), budgets=(), reps=args.reps, warmup=1, n_predict=args.n_predict,
                     prompts=kit.select(kit.load_prompts(), ["text"], limit=args.limit), ctx=4096, seed=1,
                     threads=args.threads, extra_args=tuple(extra),
                     explicit_arms=(Arm("draft@k0", d, 1, p_min=0.0, cost_table=table),))
    jsonl = args.out / "defer-cost.jsonl"
    rows = []
    for defer in (True, False):
        with patches.switched_off(() if defer else ("0005",)):  # 0005 off: a draft decode per step
            res = run_bench(engine, plan, out=jsonl, run_id="defer" if defer else "no-defer")
        for s in res.summaries:
            if s["category"] == ALL:
                rows.append({"defer": defer, "config": s["config"], "tok_s": s["tok_s"], "speedup": s.get("speedup"),
                             "identical": s.get("identical"), "drafted": s.get("drafted")})
                print(f"{'deferred' if defer else 'per step':>9} {s['config']:>9}: {s['tok_s']['median']:.1f} tok/s "
                      f"({s['tok_s']['min']:.1f}-{s['tok_s']['max']:.1f})  speedup {s.get('speedup') or 1.0:.3f}")
    (args.out / "defer-cost.json").write_text(json.dumps({
        "kind": "defer-cost", "engine": {"commit": engine.commit, "backend": engine.backend,
                                         "dir": engine.bin_dir.parent.parent.name},
        "target": str(args.target), "draft": str(args.draft), "reps": args.reps, "n_predict": args.n_predict,
        "server_args": extra, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
