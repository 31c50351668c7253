"""Step cost of a budget on a server of its own vs through a per-request n_max on a larger budget's server.

Both runs go through `dspark bench`'s runner (records with provenance in OUT/shared-step-cost.jsonl), with
SYNTHETIC acceptance --spec-synth-len 1 (every draft rejected: a step yields one token, so ms per token is
the step cost t_step(k)). Run A starts one server per budget; run B runs every budget on the largest
budget's server (bench.servers, dspark's patched engine). It prints, per budget, the median ms per token
(min-max over reps) of each and their ratio, and writes OUT/shared-step-cost.json. --copy-all also runs
both again with DSPARK_COPY_ALL_SNAPSHOTS=1 (patch 0004 off: every recurrent snapshot copied), in the
same run, with the same build.

  python -m study.shared_step_cost --out DIR                       # a 5 %-width qwen35moe pair (hybrid), CPU
  python -m study.shared_step_cost --manifest pair/manifest-*.json --out DIR -- -ngl 99 -ngld 99 -fa on
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dsparkcli.bench.plan import Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import FIXED_SYNTHETIC
from dsparkcli.bench.run import new_pool, run_bench
from dsparkcli.bench.stats import ms_per_token
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import patches
from dsparkcli.llama.server import split_server_args
from dsparkcli.synth.full_width import measurement_pair

PROMPT = FIXED_SYNTHETIC


def main() -> int:
    argv, extra = split_server_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, help="a full-width pair's manifest (default: write a 5 %% qwen35moe one)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budgets", nargs="+", type=int, default=[1, 3, 15])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--copy-all", action="store_true", help="also patch 0004 off (DSPARK_COPY_ALL_SNAPSHOTS=1)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    fw = measurement_pair(args.manifest)
    target, draft = fw.target, fw.draft
    engine = engine_mod.describe(engine_mod.resolve_engine())
    if not engine_mod.capabilities(engine).request_draft_params:
        print(f"{engine.server} has no per-request draft settings: dspark engine build (patched)", file=sys.stderr)
        return 2
    d = Draft("draft", draft)
    arms = tuple(Arm(f"cost@{k}", d, k, p_min=0.0, synth_len=1.0) for k in sorted(args.budgets))
    plan = BenchPlan(
        target=target,
        drafts=(d,),
        budgets=(),
        prompts=(PROMPT,),
        reps=args.reps,
        warmup=1,
        n_predict=args.n_predict,
        ctx=2048,
        threads=args.threads,
        seed=1,
        ignore_eos=True,
        extra_args=tuple(extra),
        explicit_arms=arms,
    )
    jsonl = args.out / "shared-step-cost.jsonl"

    rows = []
    print(
        f"engine {engine.bin_dir.parent.parent.name}; ms per token at --spec-synth-len 1 (median, min-max of "
        f"{args.reps} reps)"
    )
    for copy_all in (False, True) if args.copy_all else (False,):
        tag = "-copy-all" if copy_all else ""
        with patches.switched_off(("0004",) if copy_all else ()):  # 0004 off: every snapshot copied
            a = ms_per_token(run_bench(engine, plan, out=jsonl, run_id=f"own{tag}").summaries)
            with new_pool(engine, share=True) as pool:
                b = ms_per_token(run_bench(engine, plan, out=jsonl, run_id=f"shared{tag}", pool=pool).summaries)
        for name in ["plain", *(arm.name for arm in arms)]:
            ra, rb = a.get(name), b.get(name)
            if not ra or not rb:
                continue
            row = {
                "config": name,
                "copy_all_snapshots": copy_all,
                "own_ms": ra["median"],
                "own_range": [ra["lo"], ra["hi"]],
                "shared_ms": rb["median"],
                "shared_range": [rb["lo"], rb["hi"]],
                "shared_over_own": rb["median"] / ra["median"],
            }
            rows.append(row)
            print(
                f"{name:>8}{' (0004 off)' if copy_all else ''}: own {ra['median']:.3f} ({ra['lo']:.3f}-"
                f"{ra['hi']:.3f})  shared {rb['median']:.3f} ({rb['lo']:.3f}-{rb['hi']:.3f})  shared/own "
                f"{row['shared_over_own']:.3f}"
            )
    (args.out / "shared-step-cost.json").write_text(
        json.dumps(
            {
                "kind": "shared-step-cost",
                "engine": {
                    "commit": engine.commit,
                    "backend": engine.backend,
                    "dir": engine.bin_dir.parent.parent.name,
                },
                "target": str(target),
                "draft": str(draft),
                "reps": args.reps,
                "n_predict": args.n_predict,
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
