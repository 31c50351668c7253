#!/usr/bin/env python3
"""Measure dspark's own overhead on one request (decode tok/s ratio, TTFT delta) and append a JSONL record.

Usage: python -m study.run_overhead --target T --draft D [--budget 5] [--reps 10] [--n-predict 512] --out FILE
       [-- extra llama-server args, e.g. -ngl 99 -ngld 99 -fa on]
Without --target it writes a synthetic pair (vocab 128, accept rate 1.0) to a temp dir and uses that.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from dsparkcli.bench import provenance
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.protocol import DEFAULT_BUDGET
from dsparkcli.llama.server import LlamaServer, ServerConfig, split_server_args
from dsparkcli.synth import known_answer as synth
from study import overhead


def main() -> int:
    argv, extra = split_server_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--n-predict", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    eng = engine_mod.describe(engine_mod.resolve_engine())
    with tempfile.TemporaryDirectory() as tmp:
        if args.target:
            target, draft = Path(args.target), Path(args.draft) if args.draft else None
        else:
            pair = synth.write_pair(tmp, vocab=128, accept_rate=1.0, seed=0)
            target, draft = pair.target, pair.draft
        cfg = ServerConfig(
            model=target, draft=draft, n_max=args.budget if draft else None, ctx=args.ctx, extra_args=tuple(extra)
        )
        with LlamaServer(eng, cfg) as srv:
            result = overhead.measure(
                srv.client, "Count from one to a thousand.", reps=args.reps, n_predict=args.n_predict
            )
            record = {
                "kind": "run_overhead",
                **result.to_record(),
                "provenance": provenance.collect(
                    eng, {"target": target, "draft": draft}, argv=srv.argv, reps=args.reps
                ),
            }
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"decode tok/s ratio dspark/bare = {result.decode_ratio:.4f} (median of {args.reps}); "
        f"TTFT delta = {1000 * result.ttft_delta_s:+.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
