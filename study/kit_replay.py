#!/usr/bin/env python3
"""A `dspark bench` run of a REAL pair, replayed by the torch draft (a thin client of study.replay):
per category and budget, the accepted and drafted counts llama-server reported next to the ones the
torch draft gets on the same output tokens, and both mean acceptance lengths. CPU is enough (the target
is dequantised into torch; a 36-prompt, 6-budget run takes ~10 minutes on 2 cores).

  python -m study.kit_replay BENCH.jsonl --target T.gguf --draft D.gguf --out REPLAY.json [--budget 1 6]

Needs the training extra (torch). Writes REPLAY.json (summary rows, every replayed request, provenance)
atomically; prints the table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from dsparkcli.bench.records import read_jsonl
from dsparkcli.distill.data import write_json
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.server import LlamaServer, ServerConfig
from study import replay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", type=Path)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, nargs="*", help="only these budgets (default: every one in the run)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    records = read_jsonl(args.bench)
    target, draft = replay.load_pair(args.target, args.draft, args.threads)
    engine = engine_mod.describe(engine_mod.resolve_engine())
    cfg = ServerConfig(model=args.target, draft=None, ctx=4096, threads=args.threads)
    with LlamaServer(engine, cfg) as srv:  # the engine's tokenizer, not a second one

        def progress(r: replay.ReplayedRequest) -> None:
            print(
                f"  {r.prompt_id} @{r.budget}: engine {r.engine_accepted}/{r.engine_drafted}, "
                f"torch {r.accepted}/{r.drafted}",
                file=sys.stderr,
                flush=True,
            )

        rows = replay.replay(records, target, draft, srv.client.tokenize, budgets=args.budget, on_request=progress)
    summary = replay.summarise(rows, records)
    print(
        f"{'category':8} {'k':>2} {'engine acc/drafted':>19} {'torch acc/drafted':>18} {'engine len':>10} {'torch len':>9}"
    )
    for s in summary:
        e = f"{s.engine_mean_length:.3f}" if s.engine_mean_length is not None else "-"
        t = f"{s.mean_length:.3f}" if s.mean_length is not None else "-"
        print(
            f"{s.category:8} {s.budget:>2} {s.engine_accepted:>9}/{s.engine_drafted:<9} "
            f"{s.accepted:>8}/{s.drafted:<9} {e:>10} {t:>9}"
        )
    doc = {
        **replay.record_header("kit-replay", engine, bench=args.bench, target=args.target, draft=args.draft),
        "budgets": args.budget,
        "summary": [s.to_record() for s in summary],
        "requests": [asdict(r) for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
