"""BENCHMARKS.md's sections on the H200 run of session 36 (issues 30 and 32), rendered from its records.

Records (study/results/h200/session36/, every one written by dspark or study/step_switches.py on the H200):
  real-switches/  step costs of the REAL smollm2-135m pair (SYNTHETIC acceptance --spec-synth-len 1: every draft
                  rejected, so ms per token is the step cost), three switch sets alternated over two rounds
  standin/        the same on the full-width qwen35moe stand-in (one round)
  real-kit/       `dspark bench` on the kit's text prompts, budgets 1-6 vs plain (REAL acceptance)
  tune/           `dspark tune` records: the kit's text categories, then MT-bench's first turns
  choice/         `dspark bench --budget auto adaptive 1 2 3 4 5` after those tunings, kit and MT-bench

    python -m study.session36_to_md [RESULTS_DIR]     # prints the Markdown that BENCHMARKS.md holds
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from dsparkcli.bench import stats
from dsparkcli.bench.records import read_jsonl

DEFAULT = Path(__file__).resolve().parent / "results" / "h200" / "session36"
SET_NAMES = {"patched": "per-shape key (the first 0008)", "stock": "stock key", "no graphs": "no CUDA graphs"}


def step_costs(doc: dict) -> list[str]:
    """Median over rounds of each cell's median ms per token; t_step(k) / t1 per switch set."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in doc["rows"]:
        if r["table"] == "cost":
            cells.setdefault((r["switches"], r["config"]), []).append(r["ms"])
    configs = sorted({c for _, c in cells}, key=lambda c: (c != "plain", int(c.split("@")[1]) if "@" in c else 0))
    out = [
        "| switch set | "
        + " | ".join(f"{c} ms" for c in configs)
        + " | "
        + " | ".join(f"t_step({c.split('@')[1]}) / t1" for c in configs if c != "plain")
        + " |",
        "|---|" + "---|" * (2 * len(configs) - 1),
    ]
    for name in doc["switch_sets"]:
        med = {c: statistics.median(cells[(name, c)]) for c in configs if (name, c) in cells}
        t1 = med["plain"]
        out.append(
            f"| {SET_NAMES.get(name, name)} | "
            + " | ".join(
                f"{med[c]:.3f} ({min(cells[(name, c)]):.3f}-{max(cells[(name, c)]):.3f})"
                if len(cells[(name, c)]) > 1
                else f"{med[c]:.3f}"
                for c in configs
            )
            + " | "
            + " | ".join(f"{med[c] / t1:.2f}" for c in configs if c != "plain")
            + " |"
        )
    return out


def budgets_table(rows: list) -> list[str]:
    """Per category: plain tok/s, then each configuration's speedup and mean acceptance length."""
    configs = []
    for s in rows:
        if s["config"] not in configs:
            configs.append(s["config"])
    cats = [c for c in dict.fromkeys(s["category"] for s in rows)]
    short = {c: c.split("@")[1] if "@" in c else c for c in configs}
    out = [
        "| category | plain tok/s (min-max) | "
        + " | ".join(f"{short[c]}" for c in configs if c != "plain")
        + " | best |",
        "|---|---|" + "---|" * (len(configs) - 1) + "---|",
    ]
    for cat in cats:
        by = {s["config"]: s for s in rows if s["category"] == cat}
        p = by["plain"]["tok_s"]
        cells, best = [], ("plain", 1.0)
        for c in configs:
            if c == "plain" or c not in by:
                continue
            s = by[c]
            L = s["mean_length"]
            cells.append(f"{s['speedup']:.2f}×" + (f" ({L:.2f})" if L else " (no draft)"))
            if short[c].isdigit() and s["speedup"] > best[1]:
                best = (short[c], s["speedup"])
        out.append(
            f"| {cat} | {p['median']:.0f} ({p['min']:.0f}-{p['max']:.0f}) | "
            + " | ".join(cells)
            + f" | {best[0]} ({best[1]:.2f}×) |"
        )
    return out


def tune_table(record: dict) -> list[str]:
    verified = {(v["category"], v["candidate"]): v["speedup"] for v in record["verified"]}
    preds = {(p["category"], p["budget"], p["p_min"]): p["speedup"] for p in record["predictions"]}
    off = []
    for (cat, cand), measured in verified.items():
        k, _, p = cand.partition(",p=")
        key = (cat, int(k.split("=")[1]), float(p) if p else 0.0)
        if key in preds:
            off.append(abs(preds[key] / measured - 1))
    c = record["cost"]
    lines = [
        f"cost model: t1 {c['t1_ms']:.3f} ms; t_step(k) "
        + ", ".join(f"{k} {v:.2f}" for k, v in c["t_step_ms"].items())
        + f" ms; s {c['s_ms']:.3f} ms per accepted token; "
        + "; ".join(f"p-min {p} +{v:.3f} ms per block position a round" for p, v in c["p_min_ms"].items()),
        "",
        f"verified cells: {len(off)}; more than 10 % off: {sum(o > 0.10 for o in off)}; median |off| "
        f"{100 * statistics.median(off):.0f} %",
        "",
        "| category | mean len @k_max | choice | predicted | measured (tune's own cells) |",
        "|---|---|---|---|---|",
    ]
    acc = {a["category"]: a["mean_length"] for a in record["acceptance"]}
    for ch in record["choices"]:
        pick = "plain" if ch["plain"] else f"k={ch['budget']}" + (f", p={ch['p_min']}" if ch["p_min"] else "")
        pred = f"{ch['predicted']:.2f}×" if ch["predicted"] is not None else "-"
        lines.append(
            f"| {ch['category']} | {acc.get(ch['category'], float('nan')):.2f} | {pick} | {pred} | "
            f"{ch['measured']:.2f}× |"
        )
    return lines


def render(root: Path = DEFAULT) -> str:
    real = json.loads((root / "real-switches/step-switches.json").read_text())
    stand = json.loads((root / "standin/step-switches.json").read_text())
    w = []
    w.append(
        f"#### Step costs, REAL pair (ms per token at --spec-synth-len 1; median of {real['rounds']} rounds, "
        f"their range; {real['reps']} reps of {real['n_predict']} tokens each)"
    )
    w += ["", *step_costs(real), ""]
    w.append(
        f"#### Step costs, full-width stand-in (SYNTHETIC; {stand['rounds']} round, {stand['reps']} reps of "
        f"{stand['n_predict']} tokens)"
    )
    w += ["", *step_costs(stand), ""]
    kit = [s.to_record() for s in stats.summarize(read_jsonl(root / "real-kit/bench.jsonl"))]
    w.append(
        "#### The kit's text prompts, budgets 1-6 vs plain (REAL acceptance; speedup (mean acceptance length); "
        "2 rounds)"
    )
    w += ["", *budgets_table(kit), ""]
    for name, title in (("tune-kit", "the kit's text categories"), ("tune-mt", "MT-bench's first turns")):
        w.append(f"#### `dspark tune` on {title} (REAL acceptance)")
        w += ["", *tune_table(json.loads((root / f"tune/{name}.json").read_text())), ""]
    for name, title in (("bench-kit", "the kit's text prompts"), ("bench-mt", "MT-bench's first turns")):
        rows = [s.to_record() for s in stats.summarize(read_jsonl(root / f"choice/{name}.jsonl"))]
        w.append(f"#### After tune: plain, fixed budgets, auto and adaptive on {title} (REAL acceptance; 2 rounds)")
        w += ["", *budgets_table(rows), ""]
    return "\n".join(w).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT))
