"""Tokens/s of distill's two generators on the same prompts: batched `generate` vs continuous batching.

    python -m study.bench_generate TARGET.gguf PROMPTS.json [--n 64] [--pool 16] [--max-new 128]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--check-exact]

PROMPTS.json is a distill work folder's prompts.json (stage 1). Both generators run greedy over the same
first N prompts (batches of --pool for `generate`, a pool of --pool slots for the continuous one); the
line printed is JSON with each one's seconds, response tokens and tokens/s, their ratio, and (with
--check-exact) how many answers differ (0 expected in float32).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dsparkcli.distill.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", type=Path)
    ap.add_argument("prompts", type=Path)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--check-exact", action="store_true")
    a = ap.parse_args()
    pj = json.loads(a.prompts.read_text())
    prompts, stop = pj["ids"][: a.n], pj["stop"]
    target, _ = load_target(a.target)
    target.to(a.device, getattr(torch, a.dtype))

    def sync() -> None:
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(fn):  # type: ignore[no-untyped-def]
        sync()
        t = time.monotonic()
        res = fn()
        sync()
        dt = time.monotonic() - t
        toks = sum(len(r) for r in res)
        return res, {"s": round(dt, 2), "tokens": toks, "tok_s": round(toks / dt, 1)}

    batched, rb = timed(
        lambda: [
            r
            for i in range(0, len(prompts), a.pool)
            for r in target.generate(prompts[i : i + a.pool], a.max_new, stop)
        ]
    )
    cont, rc = timed(lambda: target.generate_continuous(prompts, a.max_new, stop, slots=a.pool))
    out = {
        "device": a.device,
        "dtype": a.dtype,
        "n": len(prompts),
        "pool": a.pool,
        "max_new": a.max_new,
        "batched": rb,
        "continuous": rc,
        "speedup": round(rc["tok_s"] / rb["tok_s"], 2),
        "mean_answer": round(rc["tokens"] / len(prompts), 1),
    }
    if a.check_exact:
        out["answers_differing"] = sum(x != y for x, y in zip(batched, cont))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
