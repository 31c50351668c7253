#!/usr/bin/env python3
"""How far a trained draft transfers to code tasks it never saw (a thin client of distill.templates and
distill.parity): the target answers the same one-line code templates (templates.CODE_FORMS, the same form
and language per pair) once with a task from the training task list (templates.CODE_TASKS) and once with a
task that is in no list the trainer draws from (NEW_TASKS below, none a kit task), plus the kit's own
code prompts; the torch draft is replayed on each greedy answer in llama-server's loop, and the mean
acceptance length per set is reported. The torch replay gives llama.cpp's counts (study/kit_replay.py).

Why: distill's validation holds whole templates out but not tasks, so its acceptance can overstate the
kit's when the draft has learnt the answers to the training tasks rather than code.

  python -m study.draft_transfer --target T.gguf --draft D.gguf --out TRANSFER.json [--pairs 24] [--budget 6]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from dsparkcli.bench import prompts as kit
from dsparkcli.bench import stats
from dsparkcli.distill import parity, templates
from dsparkcli.distill.data import write_json
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.protocol import mean_acceptance_length
from dsparkcli.llama.server import LlamaServer, ServerConfig
from study import replay

NEW_TASKS = (
    "computes the length of the Collatz sequence of a number",
    "converts a hexadecimal string to an integer",
    "finds the longest increasing subsequence of a list",
    "checks whether a year is a leap year",
    "shuffles a list with the Fisher-Yates algorithm",
    "counts the set bits of an integer",
    "prints Pascal's triangle up to n rows",
    "finds the majority element of an array",
    "encodes a string with run-length encoding",
    "computes the Hamming distance of two strings",
    "parses a URL query string into a dictionary",
    "finds the first non-repeating character in a string",
    "computes the n-th Catalan number",
    "performs a topological sort of a directed graph",
    "validates a credit card number with the Luhn check",
    "converts an RGB colour to a hex string",
    "finds the k-th smallest element of an array",
    "implements a simple event emitter",
    "computes the area of a polygon from its vertices",
    "wraps text to a given line width",
    "implements a union-find structure with path compression",
    "counts the islands in a grid of 0s and 1s",
    "converts a duration in seconds to hours, minutes and seconds",
    "checks whether a string has all unique characters",
)


def prompt_sets(pairs: int, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    seen, new = [], []
    for i in range(pairs):
        form, lang = rng.choice(templates.CODE_FORMS), rng.choice(templates.LANGS)
        seen.append(form.format(lang=lang, task=rng.choice(templates.CODE_TASKS)))
        new.append(form.format(lang=lang, task=NEW_TASKS[i % len(NEW_TASKS)]))
    return {
        "training tasks": seen,
        "new tasks": new,
        "kit code": [p.text for p in kit.load_prompts() if p.category == "code"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    assert not set(NEW_TASKS) & set(templates.CODE_TASKS)
    target, draft = replay.load_pair(args.target, args.draft, args.threads)
    engine = engine_mod.describe(engine_mod.resolve_engine())
    sets = prompt_sets(args.pairs, args.seed)
    rows = []
    with LlamaServer(engine, ServerConfig(model=args.target, draft=None, ctx=4096, threads=args.threads)) as srv:
        for name, texts in sets.items():
            for text in texts:
                rendered = srv.client.apply_template([{"role": "user", "content": text}])
                r = srv.client.completion(
                    {"prompt": rendered, "n_predict": args.n_predict, "temperature": 0, "return_tokens": True}
                )
                n_predict = replay.n_predict_for(r["stop_type"], len(r["tokens"]), args.budget)
                sim = parity.simulate(
                    target, draft, srv.client.tokenize(rendered), r["tokens"], args.budget, n_predict
                )
                rows.append(
                    {
                        "set": name,
                        "prompt": text,
                        "tokens": len(r["tokens"]),
                        "accepted": sim.accepted,
                        "drafted": sim.drafted,
                        "steps": sim.steps,
                    }
                )
                print(
                    f"  {name}: {mean_acceptance_length(sim.accepted, sim.steps) or 0:.2f}  {text[:70]}",
                    file=sys.stderr,
                    flush=True,
                )
    summary = []
    for name in sets:
        rs = [r for r in rows if r["set"] == name]
        acc, steps = sum(r["accepted"] for r in rs), sum(r["steps"] for r in rs)
        per = stats.spread([mean_acceptance_length(r["accepted"], r["steps"]) or 1.0 for r in rs])
        summary.append(
            {
                "set": name,
                "prompts": len(rs),
                "accepted": acc,
                "steps": steps,
                "mean_length": mean_acceptance_length(acc, steps),
                "per_prompt_min": per["min"],
                "per_prompt_median": per["median"],
                "per_prompt_max": per["max"],
            }
        )
        print(
            f"{name:15} prompts {len(rs):3}  mean length @{args.budget} {summary[-1]['mean_length']:.3f}  "
            f"(per prompt {per['min']:.2f}-{per['max']:.2f}, median {per['median']:.2f})"
        )
    doc = {
        **replay.record_header("draft-transfer", engine, target=args.target, draft=args.draft),
        "budget": args.budget,
        "n_predict": args.n_predict,
        "seed": args.seed,
        "label": "REAL",
        "summary": summary,
        "requests": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
