"""BENCHMARKS.md's lease section, generated from study/results/<gpu>/lease-<date>/ (python -m study.lease render).

Every figure is read from a record a dspark command wrote on the lent machine (bench JSONL through
``dsparkcli.bench.stats.summarize``, tune's record and cost table), labelled REAL or SYNTHETIC by the
records themselves; nothing here is typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsparkcli.bench import stats
from dsparkcli.bench.records import read_jsonl  # the seam (tests/test_layout.py), not bench.jsonl itself

SPEC_BENCH_GROUPS = ("translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def task_group(category: str) -> str:
    """Spec-Bench's six task groups: its five own categories, and MT-bench's eight as one."""
    return "mt_bench" if category in MT_BENCH else category


def cost_table(path: Path) -> dict[int, float]:
    """k -> ms per step (k = 0: plain ms per token), from tune's --cost-table file."""
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = float(parts[1])
    return out


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def summaries(path: Path, *, grouped: bool = False) -> list[dict[str, Any]]:
    records = list(read_jsonl(path))
    if grouped:
        records = [
            {**r, "category": task_group(r["category"])} if isinstance(r.get("category"), str) else r for r in records
        ]
    return [s.to_record() for s in stats.summarize(records)]


def label(rows: list[dict[str, Any]]) -> str:
    return "SYNTHETIC" if any(r.get("synthetic") for r in rows) else "REAL"


def bench_table(rows: list[dict[str, Any]], categories: list[str] | None = None) -> list[str]:
    """config × category: median tok/s (min–max), speedup vs plain of the same run, mean acceptance length."""
    cats = categories or list(dict.fromkeys(r["category"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    cell = {(r["config"], r["category"]): r for r in rows}
    out = ["| config | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for conf in configs:
        cells = []
        for c in cats:
            r = cell.get((conf, c))
            if r is None:
                cells.append("–")
                continue
            t = r["tok_s"]
            s = f"{_f(t['median'], '{:.0f}')} ({_f(t['min'], '{:.0f}')}–{_f(t['max'], '{:.0f}')}) tok/s, {_f(r['speedup'])}x"
            if r.get("mean_length") is not None:
                s += f", τ {_f(r['mean_length'])}"
            cells.append(s)
        out.append(f"| {conf} | " + " | ".join(cells) + " |")
    return out


def best_per_category(rows: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    best: dict[str, tuple[str, float]] = {}
    for r in rows:
        if r["category"] == "all" or r["speedup"] is None:
            continue
        if r["category"] not in best or r["speedup"] > best[r["category"]][1]:
            best[r["category"]] = (r["config"], r["speedup"])
    return best


def pick_config(pick: dict[str, Any], configs: list[str]) -> str | None:
    """The bench configuration that runs a tune pick (plain; an n-gram type; the draft or a chain at k)."""
    method, k = pick.get("method") or ("plain" if pick.get("plain") else "dspark"), pick.get("budget")
    if method == "plain" or (method == "dspark" and pick.get("plain")):
        return "plain"
    for c in configs:
        head, _, at = c.partition("@")
        if method == "dspark" and at == str(k) and not head.startswith("ngram"):
            return c
        if method != "dspark" and head == method and (at == "" or at == str(k)):
            return c
    return None


def tune_picks(path: Path) -> dict[str, dict[str, Any]]:
    rec = json.loads(path.read_text())
    picks = {c["category"]: c for c in rec.get("choices") or []}
    for m in rec.get("method_choices") or []:
        picks.setdefault(m["category"], {})["method"] = m["method"]
    return picks


def leg_section(name: str, d: Path) -> list[str]:
    out: list[str] = []
    if (d / "cost-table.txt").is_file():
        cost = cost_table(d / "cost-table.txt")
        t1 = cost.get(0)
        if t1:
            parts = [f"t1 = {t1:.3f} ms"] + [
                f"t_step({k}) = {v:.3f} ms ({v / t1:.2f}x t1)" for k, v in cost.items() if k
            ]
            out.append("Step costs (tune's cost table, nothing accepted): " + "; ".join(parts) + ".")
            out.append("")
    if (d / "inspect.json").is_file():
        pairing = json.loads((d / "inspect.json").read_text()).get("pairing") or {}
        checks = ", ".join(f"{c['name']} ({c['detail']})" for c in pairing.get("checks", []) if c.get("ok"))
        verdict = "fit" if pairing.get("ok") else f"do not fit: {'; '.join(pairing.get('reasons', []))}"
        out.append(f"`dspark inspect` target, draft, mmproj: they {verdict}; {checks}.")
        out.append("")
    if (d / "run.json").is_file():
        run = json.loads((d / "run.json").read_text())
        st = run.get("stats") or run
        keys = ("n_tokens", "decode_tok_s", "budget", "acceptance_rate", "mean_acceptance_length", "acceptance_kind")
        found = {k: round(st[k], 3) if isinstance(st[k], float) else st[k] for k in keys if k in st}
        out.append(f"`dspark run IMAGE PROMPT` on the stand-in: {json.dumps(found)}.")
        out.append("")
    if (d / "bench.jsonl").is_file():
        rows = summaries(d / "bench.jsonl")
        if rows:
            out.append(f"**{label(rows)}** — `dspark bench` (records: `{d.name}/bench.jsonl`):")
            out.append("")
            out += bench_table(rows)
            out.append("")
            if name.startswith("specbench"):
                groups = summaries(d / "bench.jsonl", grouped=True)
                out.append(f"**{label(groups)}** — Spec-Bench task groups (MT-bench's eight categories as one):")
                out.append("")
                out += bench_table(groups)
                out.append("")
    if (d / "tune.json").is_file() and name != "baseline-real":
        picks = tune_picks(d / "tune.json")
        # the bench that judges the picks: this leg's own, or (Spec-Bench's tune) the Spec-Bench leg's
        judge = d / "bench.jsonl" if (d / "bench.jsonl").is_file() else d.parent / "specbench-methods" / "bench.jsonl"
        rows = summaries(judge) if judge.is_file() else []
        best = best_per_category(rows)
        speed = {(r["config"], r["category"]): r["speedup"] for r in rows}
        configs = list(dict.fromkeys(r["config"] for r in rows))
        out.append(
            f"tune's picks per category (tune's measured speedup) against the fastest configuration of "
            f"`{judge.parent.name}/bench.jsonl`; 'within 3 %' compares the pick's speedup there with the fastest:"
        )
        out.append("")
        out.append("| category | pick | method | tune's measured | pick in bench | bench's fastest | within 3 % |")
        out.append("|---|---|---|---|---|---|---|")
        for cat, p in picks.items():
            if cat == "all":
                continue
            pick = "plain" if p.get("plain") else (f"budget {p.get('budget')}" if p.get("budget") else "–")
            b = best.get(cat)
            conf = pick_config(p, configs)
            mine = speed.get((conf, cat)) if conf else None
            within = "–" if mine is None or b is None else ("yes" if mine >= 0.97 * b[1] else "no")
            out.append(
                f"| {cat} | {pick} | {p.get('method', '–')} | {_f(p.get('measured'))}x | "
                + (f"{conf} {_f(mine)}x" if conf else "–")
                + " | "
                + (f"{b[0]} {b[1]:.2f}x" if b else "–")
                + f" | {within} |"
            )
        out.append("")
    return out


def render(results: Path) -> str:
    out = [
        "## GPU leases (generated: `python -m study.lease render`)",
        "",
        "Each lease's legs, from the records under `study/results/<gpu>/lease-<date>/`. Greedy; speedups are "
        "against plain decoding measured in the same leg.",
        "",
    ]
    logs = sorted(results.glob("*/lease-*/lease-log.json"))
    if not logs:
        out.append("No lease has been imported yet.")
    for log_path in logs:
        log = json.loads(log_path.read_text())
        d = log_path.parent
        rel = d.relative_to(results)
        out.append(f"### {rel} — {log.get('machine', '').splitlines()[0] if log.get('machine') else '?'}")
        out.append("")
        lease = log.get("lease", {})
        out.append(
            "Lease: " + ", ".join(f"{k} {v}" for k, v in lease.items() if v is not None and k != "first_call_at") + "."
        )
        out.append("")
        out.append("| leg | rc | seconds |")
        out.append("|---|---|---|")
        for leg in log.get("legs", []):
            out.append(f"| {leg['name']} | {leg.get('rc')} | {leg.get('seconds', '–')} |")
        out.append("")
        for leg in log.get("legs", []):
            leg_dir = d / leg["name"]
            if leg.get("rc") == 0 and leg_dir.is_dir():
                body = leg_section(leg["name"], leg_dir)
                if body:
                    out.append(f"#### {leg['name']}")
                    out.append("")
                    out += body
    return "\n".join(out).rstrip() + "\n"
