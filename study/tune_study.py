"""`dspark tune` against a full grid, in the same run (issue 16), on a pair with SYNTHETIC acceptance.

For each acceptance length L (default: the seven upstream categories of minicpm-v-4.7): `dspark tune`'s
core with --synth-len L (the cost model is measured once, for the first L, and reused after), then a
full grid on the same pair, same emulation, same prompts, tokens and reps: plain and every budget that
can hold L. Per L it reports tune's pick, the pick's speedup as the grid measured it, the grid's best,
fixed budget 5, and both wall times. Tune runs with its own defaults (1 rep, 128 tokens, cost cells of
48); the grid follows BENCHMARKS.md's protocol (3 reps, 256 tokens) unless told otherwise.

  python -m study.tune_study --manifest pair/manifest-*.json --out DIR [-- llama-server args]
  python -m study.tune_study --target t.gguf --draft d.gguf --out DIR --lengths 2 3 --budgets 1 2 4 \\
      --n-predict 32 --reps 1 --threads 1          # the CPU check on a known-answer pair

--mode rates (default): smaller budgets keep the per-position rates of L at the largest budget (what a
real draft does); --mode length: mean L at every budget (BENCHMARKS.md's grid, k >= L - 1 only).
--adaptive (issue 20, dspark's patched engine): the grid gets an arm of llama.cpp's adaptive budget on
tune's cost model (adaptive_in_grid, adaptive_vs_pick); --tune-adaptive: tune verifies it too (its wall
time then includes that arm).

The seven tunes share one server pool (bench.servers), as one `dspark tune` over seven workloads would:
plain decoding's server stays loaded, and a cell whose server is loaded reuses it; with --share-servers
each L's budgets also run on one server through a per-request budget. The grid starts a server per
configuration, as `dspark bench --budget ...` does.
Writes DIR/tune-study.jsonl (every bench record), DIR/tune-records.jsonl (one tuning record per L),
DIR/tune-study.json (the summary), and prints one line per L. --deadline EPOCH stops starting new work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dsparkcli.bench import tuning
from dsparkcli.bench.plan import ADAPTIVE_LABEL, BenchPlan, Draft
from dsparkcli.bench.prompts import FIXED_SYNTHETIC
from dsparkcli.bench.records import PLAIN
from dsparkcli.bench.run import new_pool, run_bench
from dsparkcli.bench.summaries import ALL
from dsparkcli.budget import model as tune
from dsparkcli.budget.model import Candidate
from dsparkcli.hub.registry import upstream_acceptance
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.server import split_server_args
from dsparkcli.synth.full_width import read_manifest

UPSTREAM = upstream_acceptance()  # category -> upstream mean acceptance length, shortest first
PROMPT = FIXED_SYNTHETIC


def _pair(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.manifest:
        fw = read_manifest(args.manifest)
        return fw.target, fw.draft
    return Path(args.target), Path(args.draft)


def _grid(
    engine, tp: tuning.TunePlan, out: Path, run_id: str, reps: int, n_predict: int, table: Path | None = None
) -> tuple[dict[int | str, float], float]:
    """Plain and every runnable budget, one server each (and the adaptive budget on ``table``):
    {k or "adaptive": speedup over plain (all)}, wall seconds."""
    arms = [tuning.candidate_arm(tp, Candidate(k, 0.0)) for k in sorted(tp.budgets) if tp.runnable(k)]
    if table is not None:
        arms.append(tuning.adaptive_arm(tp, table))
    plan = BenchPlan(
        target=tp.target,
        drafts=(Draft("draft", tp.draft),),
        budgets=(),
        prompts=tp.prompts,
        reps=reps,
        warmup=tp.warmup,
        n_predict=n_predict,
        ctx=tp.ctx,
        threads=tp.threads,
        seed=tp.seed,
        ignore_eos=True,
        extra_args=tp.extra_args,
        explicit_arms=tuple(arms),
    )
    # the grid's wall time is that of its budgets: up to the last request before the adaptive arm's (which
    # adds its own server; leaving its stop out makes tune's share of the time, if anything, larger)
    t0, last = time.monotonic(), [0.0]

    def on_request(config: str, prompt_id: str) -> None:
        if config != ADAPTIVE_LABEL:
            last[0] = time.monotonic()

    res = run_bench(engine, plan, out=out, run_id=run_id, on_request=on_request)
    wall = (last[0] if table is not None else time.monotonic()) - t0
    by_name: dict[str, int | str] = {a.name: ("adaptive" if a.adaptive else a.budget) for a in arms}  # type: ignore[misc]
    return {
        by_name[s.config]: s.speedup
        for s in res.summaries
        if s.category == ALL and s.config != PLAIN and s.speedup is not None
    }, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--lengths", nargs="+", type=float, default=list(UPSTREAM.values()))
    ap.add_argument("--budgets", nargs="+", type=int, default=list(tuning.DEFAULT_BUDGETS))
    ap.add_argument("--mode", choices=tuning.SYNTH_MODES, default="rates")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--cost-n-predict", type=int, default=48)
    ap.add_argument("--reps", type=int, default=1, help="tune's reps per cell")
    ap.add_argument("--grid-reps", type=int, default=3, help="the grid's (BENCHMARKS.md: 3)")
    ap.add_argument("--grid-n-predict", type=int, default=256, help="the grid's tokens (BENCHMARKS.md: 256)")
    ap.add_argument(
        "--top",
        type=int,
        default=tuning.TunePlan.top,
        help="tune's candidates per category (its default; the H200 run of 2026-12-01 used 1)",
    )
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--phase", choices=("both", "tune", "grid"), default="both")
    ap.add_argument("--deadline", type=float, help="epoch seconds: no new L starts after this")
    ap.add_argument(
        "--adaptive", action="store_true", help="the grid: also llama.cpp's adaptive budget (patched engine)"
    )
    ap.add_argument("--tune-adaptive", action="store_true", help="tune verifies the adaptive budget too")
    ap.add_argument(
        "--share-servers",
        action="store_true",
        help="budgets share a server through per-request "
        "n_max (bench.servers; the H200 run of 2026-12-01 did, and its cost model was biased)",
    )
    ap.add_argument(
        "--tables-dir",
        type=Path,
        help="where the per-L cost tables go (default --out; the GPU machine returns 8 files a call)",
    )
    argv, extra = split_server_args(sys.argv[1:])
    args = ap.parse_args(argv)
    if not args.manifest and not (args.target and args.draft):
        ap.error("give --manifest, or --target and --draft")
    target, draft = _pair(args)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DSPARK_CACHE_DIR", str(args.out / "cache"))  # the tuning store of this study
    engine = engine_mod.describe(engine_mod.resolve_engine())
    jsonl = args.out / "tune-study.jsonl"
    names = {v: k for k, v in UPSTREAM.items()}
    rows, tune_wall, grid_wall = [], 0.0, 0.0
    pool = new_pool(engine, share=args.share_servers and engine_mod.capabilities(engine).request_draft_params)
    with pool:
        for i, length in enumerate(args.lengths):
            row = _one_length(args, engine, pool, jsonl, names, target, draft, extra, i, length)
            if row is None:
                break
            tune_wall += row.get("tune_wall_s", 0.0)
            grid_wall += row.get("grid_wall_s", 0.0)
            rows.append(row)
    return _summarize(args, engine, target, draft, extra, rows, tune_wall, grid_wall)


def _one_length(args, engine, pool, jsonl, names, target, draft, extra, i, length) -> dict | None:
    if args.deadline and time.time() > args.deadline:
        print(f"deadline: stopped before L {length}", flush=True)
        return None
    tp = tuning.TunePlan(
        target=target,
        draft=draft,
        prompts=(PROMPT,),
        budgets=tuple(args.budgets),
        n_predict=args.n_predict,
        cost_n_predict=args.cost_n_predict,
        reps=args.reps,
        top=args.top,
        ctx=args.ctx,
        threads=args.threads,
        extra_args=tuple(extra),
        synth_len=length,
        synth_mode=args.mode,
        ignore_eos=True,
        reuse_cost=i > 0,
        adaptive=args.tune_adaptive,
    )
    table = None
    row: dict = {"L": length, "category": names.get(length), "mode": args.mode}
    if args.phase in ("both", "tune"):
        t0 = time.monotonic()
        rec = tuning.run_tune(engine, tp, out=jsonl, pool=pool)
        row["tune_wall_s"] = time.monotonic() - t0
        with open(args.out / "tune-records.jsonl", "a", encoding="utf-8") as fh:  # few files: the GPU returns 8
            fh.write(json.dumps(rec.to_record()) + "\n")
        c = rec.choice()
        if args.adaptive:
            table = (args.tables_dir or args.out) / f"cost-L{length:g}.txt"
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(tune.cost_table(rec.cost), encoding="utf-8")
            row["tune_adaptive_measured"] = next(
                (s for cat, lb, s in rec.verified if cat == ALL and lb == "adaptive"), None
            )
            static = (c.measured if c.measured is not None else 1.0) if c and c.candidate else 1.0
            if row["tune_adaptive_measured"]:  # the static pick (or plain) and adaptive in one run
                row["tune_adaptive_vs_pick"] = row["tune_adaptive_measured"] / static
        row.update(
            tune_pick=c.candidate.budget if c and c.candidate else None,
            tune_predicted=c.predicted if c else None,
            tune_measured=c.measured if c else None,
            predicted={p.candidate.budget: round(p.speedup, 4) for p in rec.predictions if p.category == tune.OVERALL},
            timings_s=rec.timings_s,
        )
    if args.phase in ("both", "grid"):
        grid, wall = _grid(
            engine, tp, jsonl, f"grid-L{length:g}-{int(time.time())}", args.grid_reps, args.grid_n_predict, table
        )
        adaptive = grid.pop("adaptive", None)
        best = max(grid.items(), key=lambda kv: kv[1]) if grid else (None, 1.0)
        best = best if best[1] > 1.0 else (None, 1.0)
        row.update(
            grid={k: round(v, 4) for k, v in grid.items()},
            grid_wall_s=wall,
            grid_best=best[0],
            grid_best_speedup=best[1],
            k5_speedup=grid.get(5),
        )
        if "tune_pick" in row:
            got = 1.0 if row["tune_pick"] is None else grid.get(row["tune_pick"])
            row.update(
                pick_in_grid=got,
                pick_vs_best=got / best[1] if got else None,
                pick_vs_k5=got / grid[5] if got and grid.get(5) else None,
            )
            if adaptive is not None:
                row.update(
                    adaptive_in_grid=adaptive,
                    adaptive_vs_pick=adaptive / got if got else None,
                    adaptive_vs_best=adaptive / best[1],
                )
    print(
        json.dumps(
            {
                k: row.get(k)
                for k in (
                    "L",
                    "tune_pick",
                    "tune_measured",
                    "grid_best",
                    "grid_best_speedup",
                    "pick_vs_best",
                    "pick_vs_k5",
                    "tune_adaptive_measured",
                    "tune_adaptive_vs_pick",
                    "adaptive_in_grid",
                    "adaptive_vs_pick",
                    "tune_wall_s",
                    "grid_wall_s",
                )
            }
        ),
        flush=True,
    )
    return row


def _summarize(args, engine, target, draft, extra, rows, tune_wall, grid_wall) -> int:
    vs_best = [r["pick_vs_best"] for r in rows if r.get("pick_vs_best")]
    vs_k5 = [r["pick_vs_k5"] for r in rows if r.get("pick_vs_k5")]
    summary = {
        "kind": "tune-study",
        "engine": {"commit": engine.commit, "backend": engine.backend},
        "target": str(target),
        "draft": str(draft),
        "mode": args.mode,
        "n_predict": args.n_predict,
        "reps": args.reps,
        "grid_reps": args.grid_reps,
        "grid_n_predict": args.grid_n_predict,
        "budgets": args.budgets,
        "server_args": extra,
        "rows": rows,
        "tune_wall_s": tune_wall,
        "grid_wall_s": grid_wall,
        "tune_over_grid_wall": tune_wall / grid_wall if grid_wall else None,
        "min_pick_vs_best": min(vs_best) if vs_best else None,
        "mean_pick_vs_k5": sum(vs_k5) / len(vs_k5) if vs_k5 else None,
        "min_pick_in_grid": min((r["pick_in_grid"] for r in rows if r.get("pick_in_grid")), default=None),
        "min_adaptive_vs_pick": min((r["adaptive_vs_pick"] for r in rows if r.get("adaptive_vs_pick")), default=None),
        "min_tune_adaptive_vs_pick": min(
            (r["tune_adaptive_vs_pick"] for r in rows if r.get("tune_adaptive_vs_pick")), default=None
        ),
    }
    (args.out / "tune-study.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "tune_wall_s",
                    "grid_wall_s",
                    "tune_over_grid_wall",
                    "min_pick_vs_best",
                    "mean_pick_vs_k5",
                    "min_pick_in_grid",
                    "min_adaptive_vs_pick",
                    "min_tune_adaptive_vs_pick",
                )
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
