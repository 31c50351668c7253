#!/usr/bin/env python3
"""One GPU, two processes: a pair served directly vs through a local `dspark rpc-worker` (issue 18).

The same greedy /completion requests go to a plain llama-server (everything on this machine's device)
and to one whose target AND draft sit on a local RPC worker (``-dev RPC0 -devd RPC0``: the draft must
share the device of the target's output layer, llama.placement). It checks that the tokens and the
drafted / accepted counts are identical and reports the decode tok/s ratio rpc / direct (medians).
With ``--synth DIR`` it writes the known-answer pair and also checks both against the exact prediction.

Records (JSONL, one per line, flushed): ``request`` (mode, prompt, rep, tok/s, draft counts, tokens
sha256), ``summary`` (tokens_equal, counts_equal, predicted, medians, ratio, load seconds, argv).

    python -m study.rpc_check --synth /tmp/ka --out rpc.jsonl                       # CPU or GPU, seconds
    python -m study.rpc_check --target t.gguf --draft d.gguf --out rpc.jsonl -- -ngl 99 -ngld 99 -fa on
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from dsparkcli.bench.records import JsonlSink
from dsparkcli.bench.stats import spread, tokens_sha256
from dsparkcli.gguf.analysis import summarize
from dsparkcli.gguf.reader import read_header
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.placement import Placement
from dsparkcli.llama.rpc import RpcWorker, WorkerConfig
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth

SCHEMA = "dspark-rpc-check/1"


def prompts(vocab: int, n: int, length: int = 16) -> list[list[int]]:
    """Fixed token-id prompts inside the vocabulary (the same on every machine)."""
    return [[1 + (37 * i + 11 * j) % (vocab - 1) for j in range(length)] for i in range(n)]


def measure(
    engine: engine_mod.Engine,
    cfg: ServerConfig,
    mode: str,
    batch: list[list[int]],
    args: argparse.Namespace,
    sink: JsonlSink,
    log_dir: Path,
) -> tuple[dict, float, list[str]]:
    """Warm up, then every prompt x rep; returns ({(prompt, rep): response}, load seconds, argv)."""
    t0 = time.perf_counter()
    with LlamaServer(engine, cfg, log_dir=log_dir, startup_timeout=600) as srv:
        load_s = time.perf_counter() - t0
        body = {"n_predict": args.n_predict, "temperature": 0, "return_tokens": True, "ignore_eos": True, "seed": 0}
        srv.client.completion({**body, "prompt": batch[0]})  # warm-up: first-use allocations, graph build
        out = {}
        for rep in range(args.reps):
            for i, p in enumerate(batch):
                resp = srv.client.completion({**body, "prompt": p})
                t = resp.get("timings") or {}
                out[(i, rep)] = resp
                sink.write(
                    {
                        "record": "request",
                        "mode": mode,
                        "prompt": i,
                        "rep": rep,
                        "tok_s": t.get("predicted_per_second"),
                        "n": t.get("predicted_n"),
                        "draft_n": t.get("draft_n", 0),
                        "draft_n_accepted": t.get("draft_n_accepted", 0),
                        "tokens_sha256": tokens_sha256(resp.get("tokens") or []),
                    }
                )
        return out, load_s, srv.argv


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    extra = raw[raw.index("--") + 1 :] if "--" in raw else []
    raw = raw[: raw.index("--")] if "--" in raw else raw
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--no-draft", action="store_true", help="the target alone: does the worker change plain decoding?")
    ap.add_argument("--synth", type=Path, help="write the known-answer pair here and check the prediction too")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--synth-len",
        type=float,
        default=None,
        help="SYNTHETIC acceptance (--spec-synth-len), set by dspark, not passed after --",
    )
    ap.add_argument("--worker-device", default=None, help="the worker's device (default: its GPU, else CPU)")
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/dspark-rpc-check/logs"))
    args = ap.parse_args(raw)
    if args.synth:
        pair = synth.write_pair(args.synth, vocab=128, accept_rate=0.7, seed=11)
        args.target, args.draft = pair.target, pair.draft
    if not (args.target and (args.draft or args.no_draft)):
        ap.error("give --target and --draft (or --no-draft), or --synth DIR")
    if args.no_draft:
        args.draft = None
    engine = engine_mod.describe(engine_mod.resolve_engine(rpc=True))
    vocab = summarize(read_header(args.target)).vocab_size or 128
    batch = prompts(vocab, args.prompts)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    base = ServerConfig(
        model=args.target,
        draft=args.draft,
        n_max=args.budget,
        ctx=args.ctx,
        threads=args.threads,
        synth_len=args.synth_len,
        extra_args=tuple(extra),
    )
    sink = JsonlSink(args.out, fsync=True)
    sink.write(
        {
            "record": "provenance",
            "schema": SCHEMA,
            "engine": engine.commit,
            "backend": engine.backend,
            "server": str(engine.server),
            "argv": sys.argv,
        }
    )
    direct, direct_load, direct_argv = measure(engine, base, "direct", batch, args, sink, args.log_dir)
    with RpcWorker(
        engine, WorkerConfig(devices=args.worker_device, threads=args.threads), log_dir=args.log_dir
    ) as worker:
        placed = replace(
            base,
            placement=Placement(rpc=(worker.endpoint,), devices="RPC0", draft_device="RPC0" if args.draft else None),
        )
        rpc, rpc_load, rpc_argv = measure(engine, placed, "rpc", batch, args, sink, args.log_dir)
    keys = sorted(direct)
    tokens_equal = all(direct[k]["tokens"] == rpc[k]["tokens"] for k in keys)
    # where each prompt's two answers part (first rep): an early split and a late one are different stories
    parts = {
        str(i): next(
            (j for j, (a, b) in enumerate(zip(direct[(i, 0)]["tokens"], rpc[(i, 0)]["tokens"])) if a != b), None
        )
        for i in sorted({k[0] for k in keys})
    }

    def counts(r: dict) -> tuple[int, int]:
        t = r.get("timings") or {}
        return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))

    counts_equal = all(counts(direct[k]) == counts(rpc[k]) for k in keys)
    predicted = None
    if args.synth:
        man = synth.load_manifest(args.synth / synth.MANIFEST_NAME)
        preds = {i: synth.predict(man, p, n_max=args.budget, n_predict=args.n_predict) for i, p in enumerate(batch)}
        predicted = all(
            r[k]["tokens"] == list(preds[k[0]].tokens)
            and counts(r[k]) == (preds[k[0]].draft_n, preds[k[0]].draft_n_accepted)
            for r in (direct, rpc)
            for k in keys
        )
    d_tok = spread([direct[k]["timings"]["predicted_per_second"] for k in keys])
    r_tok = spread([rpc[k]["timings"]["predicted_per_second"] for k in keys])
    summary = {
        "record": "summary",
        "tokens_equal": tokens_equal,
        "counts_equal": counts_equal,
        "first_divergence": parts,
        "predicted": predicted,
        "direct_tok_s": d_tok,
        "rpc_tok_s": r_tok,
        "ratio": r_tok["median"] / d_tok["median"] if d_tok["median"] else None,
        "direct_load_s": direct_load,
        "rpc_load_s": rpc_load,
        "requests": len(keys),
        "n_predict": args.n_predict,
        "budget": args.budget,
        "target": str(args.target),
        "draft": str(args.draft) if args.draft else None,
        "direct_argv": direct_argv,
        "rpc_argv": rpc_argv,
    }
    sink.write(summary)
    sink.close()
    print(
        json.dumps(
            {k: summary[k] for k in ("tokens_equal", "counts_equal", "predicted", "ratio")}
            | {"direct_median_tok_s": d_tok["median"], "rpc_median_tok_s": r_tok["median"]}
        )
    )
    return 0 if tokens_equal and counts_equal and predicted is not False else 1


if __name__ == "__main__":
    sys.exit(main())
