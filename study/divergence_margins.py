#!/usr/bin/env python3
"""Are a bench's greedy divergences from plain decoding numerical near-ties? (a thin client of dspark)

For the first N drafted requests (rep 0) whose output diverges from plain decoding, the target (run in
torch from its GGUF by dsparkcli.distill.target, float32) scores plain's prefix up to the divergence;
the margin between its top two logits there is compared with the margin at every position of a few
plain outputs. Needs the training extra (torch) and the CPU engine (for the chat template's tokens).

    python -m study.divergence_margins study/results/h200/real/bench-h200.jsonl TARGET.gguf --out margins.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from dsparkcli.bench.records import read_jsonl
from dsparkcli.distill.target import load_target
from dsparkcli.llama.engine import resolve_engine
from dsparkcli.llama.server import LlamaServer, ServerConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("target", type=Path)
    ap.add_argument("--limit", type=int, default=40, help="divergent requests to score")
    ap.add_argument("--baseline-prompts", type=int, default=6, help="plain outputs scored at every position")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    recs = list(read_jsonl(a.records))
    prompts = {r["prompt_id"]: r["rendered"] for r in recs if r["record"] == "prompt"}
    req = [r for r in recs if r["record"] == "request"]
    plain = {r["prompt_id"]: r["tokens"] for r in req if r["config"] == "plain" and r["rep"] == 0}
    target, _ = load_target(a.target)
    cfg = ServerConfig(
        model=a.target, draft=None, mmproj=None, n_max=None, p_min=None, ctx=2048, threads=1, synth_len=None
    )
    with LlamaServer(resolve_engine(), cfg) as srv:
        ids = {pid: srv.client.tokenize(text) for pid, text in prompts.items()}

    def margins_at(pid: str, upto: int | None) -> list[tuple[float, tuple[int, int]]]:
        base = plain[pid] if upto is None else plain[pid][:upto]
        logits, _ = target(torch.tensor([ids[pid] + base]))
        start = len(ids[pid]) - 1 if upto is None else len(ids[pid]) + upto - 1
        out = []
        for i in range(start, len(ids[pid]) + len(base) - (1 if upto is None else 0)):
            top = logits[0, i].topk(2)
            out.append((float(top.values[0] - top.values[1]), (int(top.indices[0]), int(top.indices[1]))))
        return out

    first, swaps = [], 0
    for r in req:
        if len(first) >= a.limit:
            break
        d = r.get("first_divergence")
        if (
            r["config"] == "plain"
            or r["rep"] != 0
            or d is None
            or d >= len(plain[r["prompt_id"]])
            or d >= len(r["tokens"])
        ):
            continue
        margin, top2 = margins_at(r["prompt_id"], d)[-1]
        first.append(margin)
        swaps += int({plain[r["prompt_id"]][d], r["tokens"][d]} == set(top2))
    every = [m for pid in list(plain)[: a.baseline_prompts] for m, _ in margins_at(pid, None)]
    doc = {
        "records": str(a.records),
        "target": str(a.target),
        "divergences": len(first),
        "top2_swaps": swaps,
        "margin_at_divergence": {
            "median": statistics.median(first),
            "p90": sorted(first)[int(0.9 * len(first))],
            "max": max(first),
        },
        "margin_every_position": {
            "positions": len(every),
            "median": statistics.median(every),
            "share_below_0.25": sum(m < 0.25 for m in every) / len(every),
        },
    }
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
