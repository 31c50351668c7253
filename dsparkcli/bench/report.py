"""Render bench summaries: table rows, CSV, Markdown, JSON-ready dicts and a PNG plot.

Input is the ``summary`` records ``bench.run`` writes (``bench.records.SummaryRecord.to_record``), or
``bench.stats.summarize`` recomputes from a JSONL file; a --concurrency run's ``load_summary`` rows
have their own columns (``LOAD_COLUMNS``), a line per configuration x concurrency, and the crossover
(where a draft stops paying). A run with ``--spec-synth-len`` is labelled synthetic in every format.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYNTHETIC_LABEL = "SYNTHETIC acceptance (--spec-synth-len {L}): speeds emulate a draft, outputs are not valid"

COLUMNS = (
    "config",
    "category",
    "tok/s",
    "min-max",
    "speedup",
    "drafted",
    "accepted",
    "rate",
    "mean len",
    "upstream",
    "identical",
    "1st divergence",
    "accept/pos %",
)
CSV_FIELDS = (
    "synthetic",
    "synth_len",
    "config",
    "draft",
    "budget",
    "category",
    "prompts",
    "reps",
    "requests",
    "tokens",
    "tok_s_median",
    "tok_s_min",
    "tok_s_max",
    "speedup",
    "drafted",
    "accepted",
    "steps",
    "acceptance_rate",
    "mean_length",
    "upstream_acceptance_length",
    "identical",
    "identical_pct",
    "first_divergences",
    "acceptance_per_pos",
)


LOAD_COLUMNS = (
    "config",
    "clients",
    "agg tok/s",
    "min-max",
    "speedup",
    "req tok/s",
    "TTFT ms p50/p95/max",
    "latency ms p50/p95/max",
    "mean len",
    "rate",
    "identical",
)
LOAD_CSV_FIELDS = (
    "synthetic",
    "synth_len",
    "config",
    "draft",
    "budget",
    "concurrency",
    "prompts",
    "reps",
    "requests",
    "tokens",
    "tok_s_median",
    "tok_s_min",
    "tok_s_max",
    "speedup",
    "request_tok_s_median",
    "request_tok_s_min",
    "request_tok_s_max",
    "ttft_ms_p50",
    "ttft_ms_p95",
    "ttft_ms_max",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_max",
    "drafted",
    "accepted",
    "steps",
    "acceptance_rate",
    "mean_length",
    "identical",
    "identical_pct",
)


def is_load(summaries: Sequence[dict[str, Any]]) -> bool:
    """A --concurrency run's rows (``load_summary``)."""
    return any(s.get("record") == "load_summary" for s in summaries)


def is_synthetic(summaries: Sequence[dict[str, Any]]) -> bool:
    return any(s.get("synthetic") for s in summaries)


def synth_len_of(summaries: Sequence[dict[str, Any]]) -> float | None:
    found = next((s.get("synth_len") for s in summaries if s.get("synth_len") is not None), None)
    if found is None:  # plain-only rows: the run-level setting is in the provenance
        found = next((s.get("provenance", {}).get("synth_len") for s in summaries if s.get("provenance")), None)
    return float(found) if found is not None else 0.0


SCRIPTED_LABEL = "SYNTHETIC acceptance ({why}): a scripted pair, not a real draft"
REAL_LABEL = "REAL acceptance: a real draft on a real target"


def synthetic_note(summaries: Sequence[dict[str, Any]]) -> str | None:
    """Why a run's figures are synthetic (emulated with --spec-synth-len, or a scripted pair), or None."""
    if not is_synthetic(summaries):
        return None
    prov = next((s["provenance"] for s in summaries if s.get("provenance")), {})
    if prov.get("synth_len") is None and all(s.get("synth_len") is None for s in summaries):
        return SCRIPTED_LABEL.format(why=prov.get("acceptance_why") or "a dspark synth pair")
    return SYNTHETIC_LABEL.format(L=f"{synth_len_of(summaries):g}")


INTERRUPTED_LABEL = "INTERRUPTED, what was measured so far"


def title(summaries: Sequence[dict[str, Any]], *, partial: bool = False) -> str:
    """The table's title; ``partial``: an interrupted run's rows, which every format says first."""
    base = "dspark bench: plain vs draft budgets (greedy; median over reps, min-max)"
    if is_load(summaries):
        base = (
            "dspark bench --concurrency: N clients in flight on llama-server -np N (greedy, streamed; "
            "aggregate tok/s median over passes, min-max; speedup vs plain at the same N)"
        )
    return (f"{INTERRUPTED_LABEL}: " if partial else "") + f"{base}. {synthetic_note(summaries) or REAL_LABEL}"


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _tok(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _divergences(s: dict[str, Any], limit: int = 3) -> str:
    div = s.get("divergent") or []
    if not div:
        return "-"
    parts = [
        f"{d['prompt_id']}@{d['first_divergence'] if d['first_divergence'] is not None else '?'}" for d in div[:limit]
    ]
    return ", ".join(parts) + (f" +{len(div) - limit}" if len(div) > limit else "")


PER_POS_SHOWN = 8  # an n-gram draft's positions run to 64: past this many, the trailing zeros are cut ("+N")


def _per_pos(s: dict[str, Any]) -> str:
    values = list(s.get("acceptance_per_pos") or [])
    if not values:
        return "-"
    shown = values
    if len(values) > PER_POS_SHOWN:
        last = max((i for i, v in enumerate(values) if v > 0), default=-1)
        shown = values[: max(PER_POS_SHOWN, last + 1)]
    cut = len(values) - len(shown)
    return " ".join(f"{100 * v:.0f}" for v in shown) + (f" +{cut}x0" if cut else "")


def table_rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row of strings per summary, in COLUMNS order."""
    rows = []
    for s in summaries:
        t = s["tok_s"]
        plain = s.get("drafted") is None
        rows.append(
            (
                s["config"],
                s["category"],
                _tok(t["median"]),
                f"{_tok(t['min'])}-{_tok(t['max'])}",
                f"{s['speedup']:.2f}x" if s.get("speedup") is not None else "-",
                "-" if plain else str(s["drafted"]),
                "-" if plain else str(s["accepted"]),
                "-" if plain or s.get("acceptance_rate") is None else f"{100 * s['acceptance_rate']:.1f}%",
                "-" if plain else _num(s.get("mean_length")),
                _num(s.get("upstream_acceptance_length"), 3),
                "-" if plain else f"{s['identical']}/{s['prompts']}",
                "-" if plain else _divergences(s),
                "-" if plain else _per_pos(s),
            )
        )
    return rows


def _ms(q: dict[str, Any] | None) -> str:
    q = q or {}
    return "/".join("-" if q.get(k) is None else f"{q[k]:.1f}" for k in ("p50", "p95", "max"))


def load_table_rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row of strings per load_summary, in LOAD_COLUMNS order."""
    rows = []
    for s in summaries:
        t, plain = s["tok_s"], s.get("drafted") is None
        rows.append(
            (
                s["config"],
                str(s["concurrency"]),
                _tok(t["median"]),
                f"{_tok(t['min'])}-{_tok(t['max'])}",
                f"{s['speedup']:.2f}x" if s.get("speedup") is not None else "-",
                _tok(s["request_tok_s"]["median"]),
                _ms(s.get("ttft_ms")),
                _ms(s.get("latency_ms")),
                "-" if plain else _num(s.get("mean_length")),
                "-" if plain or s.get("acceptance_rate") is None else f"{100 * s['acceptance_rate']:.1f}%",
                "-" if plain else f"{s['identical']}/{s['prompts']}",
            )
        )
    return rows


def crossover_note(summaries: Sequence[dict[str, Any]]) -> str:
    """Where each draft stops paying, in one line (a --concurrency run)."""
    top = {s["config"]: s["concurrency"] for s in sorted(summaries, key=lambda s: s.get("concurrency") or 0)}

    def clients(n: int) -> str:
        return f"{n} client" + ("s" if n != 1 else "")

    parts = [
        f"{c}: slower than plain from {clients(n)}"
        if n is not None
        else f"{c}: faster than plain at every N measured (up to {clients(top[c])})"
        for c, n in crossover(summaries).items()
    ]
    return "crossover: " + ("; ".join(parts) if parts else "no draft configuration")


def flat(s: dict[str, Any]) -> dict[str, Any]:
    """One summary as a flat dict of CSV_FIELDS."""
    t = s["tok_s"]
    return {
        "synthetic": bool(s.get("synthetic")),
        "synth_len": s.get("synth_len"),
        "config": s["config"],
        "draft": s.get("draft"),
        "budget": s.get("budget"),
        "category": s["category"],
        "prompts": s.get("prompts"),
        "reps": s.get("reps"),
        "requests": s.get("requests"),
        "tokens": s.get("tokens"),
        "tok_s_median": t["median"],
        "tok_s_min": t["min"],
        "tok_s_max": t["max"],
        "speedup": s.get("speedup"),
        "drafted": s.get("drafted"),
        "accepted": s.get("accepted"),
        "steps": s.get("steps"),
        "acceptance_rate": s.get("acceptance_rate"),
        "mean_length": s.get("mean_length"),
        "upstream_acceptance_length": s.get("upstream_acceptance_length"),
        "identical": s.get("identical"),
        "identical_pct": s.get("identical_pct"),
        "first_divergences": ";".join(f"{d['prompt_id']}@{d['first_divergence']}" for d in s.get("divergent") or []),
        "acceptance_per_pos": " ".join(f"{v:.4f}" for v in s.get("acceptance_per_pos") or []),
    }


def load_flat(s: dict[str, Any]) -> dict[str, Any]:
    """One load_summary as a flat dict of LOAD_CSV_FIELDS."""
    row = {k: s.get(k) for k in LOAD_CSV_FIELDS}
    row["synthetic"] = bool(s.get("synthetic"))
    for block, keys in (
        ("tok_s", ("median", "min", "max")),
        ("request_tok_s", ("median", "min", "max")),
        ("ttft_ms", ("p50", "p95", "max")),
        ("latency_ms", ("p50", "p95", "max")),
    ):
        for k in keys:
            row[f"{block}_{k}"] = (s.get(block) or {}).get(k)
    return row


def to_csv(summaries: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    load = is_load(summaries)
    w = csv.DictWriter(buf, fieldnames=LOAD_CSV_FIELDS if load else CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for s in summaries:
        w.writerow({k: ("" if v is None else v) for k, v in (load_flat(s) if load else flat(s)).items()})
    return buf.getvalue()


def to_markdown(summaries: Sequence[dict[str, Any]], *, partial: bool = False) -> str:
    load = is_load(summaries)
    columns = LOAD_COLUMNS if load else COLUMNS
    lines = [
        f"**{title(summaries, partial=partial)}**",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in load_table_rows(summaries) if load else table_rows(summaries):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    if load:
        lines += ["", crossover_note(summaries)]
    return "\n".join(lines) + "\n"


def to_json_doc(
    summaries: Sequence[dict[str, Any]], *, run_id: str, out: Path, overhead: dict[str, Any], partial: bool = False
) -> dict[str, Any]:
    """The --json document: summaries without their (repeated) provenance, which is given once;
    ``partial`` (an interrupted run) adds ``"partial": true`` and the table's INTERRUPTED title."""
    clean = [{k: v for k, v in s.items() if k not in ("provenance", "run_id")} for s in summaries]
    prov = summaries[0].get("provenance") if summaries else None
    synth = is_synthetic(summaries)
    doc = {
        "run_id": run_id,
        "jsonl": str(out),
        "synthetic": synth,
        "acceptance": "SYNTHETIC" if synth else "REAL",
        "synthetic_note": synthetic_note(summaries),
        "overhead": overhead,
        "summaries": clean,
        "provenance": prov,
    }
    if is_load(summaries):
        doc["crossover"] = crossover(summaries)
    if partial:
        doc.update(partial=True, title=title(summaries, partial=True))
    return doc


def crossover(summaries: Sequence[dict[str, Any]]) -> dict[str, int | None]:
    """Per draft configuration: the lowest concurrency at which it is slower than plain (None: never)."""
    found: dict[str, int | None] = {}
    for s in sorted(
        (s for s in summaries if s.get("record") == "load_summary" and s.get("drafted") is not None),
        key=lambda s: s["concurrency"],
    ):
        found.setdefault(s["config"], None)
        if found[s["config"]] is None and s.get("speedup") is not None and s["speedup"] < 1.0:
            found[s["config"]] = s["concurrency"]
    return found


def plot(summaries: Sequence[dict[str, Any]], path: Path) -> Path:
    """Grouped bars per category: tok/s (median, min-max whiskers) and speedup vs plain, per configuration
    (a --concurrency run: lines of aggregate tok/s, speedup and p95 latency against concurrency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if is_load(summaries):
        return _plot_load(summaries, Path(path), plt)

    configs: list[str] = []
    categories: list[str] = []
    for s in summaries:
        if s["config"] not in configs:
            configs.append(s["config"])
        if s["category"] not in categories:
            categories.append(s["category"])
    by = {(s["config"], s["category"]): s for s in summaries}
    x = np.arange(len(categories))
    width = 0.8 / max(1, len(configs))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(7.0, 1.3 * len(categories) + 3), 7.5), sharex=True)
    for i, config in enumerate(configs):
        med, lo, hi, spd = [], [], [], []
        for c in categories:
            s = by.get((config, c))
            t = s["tok_s"] if s else {"median": None, "min": None, "max": None}
            m = t["median"] or 0.0
            med.append(m)
            lo.append(m - (t["min"] or m))
            hi.append((t["max"] or m) - m)
            spd.append((s.get("speedup") or 0.0) if s else 0.0)
        pos = x - 0.4 + width * (i + 0.5)
        ax1.bar(pos, med, width, yerr=[lo, hi], capsize=2, label=config, color=f"C{i}")
        ax2.bar(pos, spd, width, label=config, color=f"C{i}")
    ax1.set_ylabel("tokens/s (median, min-max)")
    ax1.legend(fontsize=8, ncol=min(4, len(configs)))
    ax1.grid(axis="y", alpha=0.3)
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("speedup vs plain")
    ax2.set_xticks(x)
    ax2.set_xticklabels(categories)
    ax2.grid(axis="y", alpha=0.3)
    head = "dspark bench: tok/s and speedup per configuration and category"
    head = f"{synthetic_note(summaries) or REAL_LABEL}\n" + head
    fig.suptitle(head, fontsize=10, color="red" if is_synthetic(summaries) else "black")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_load(summaries: Sequence[dict[str, Any]], path: Path, plt: Any) -> Path:
    configs = list(dict.fromkeys(s["config"] for s in summaries))
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 9.5), sharex=True)
    for i, config in enumerate(configs):
        rows = sorted((s for s in summaries if s["config"] == config), key=lambda s: s["concurrency"])
        x = [s["concurrency"] for s in rows]
        med = [s["tok_s"]["median"] or 0.0 for s in rows]
        lo = [m - (s["tok_s"]["min"] or m) for m, s in zip(med, rows)]
        hi = [(s["tok_s"]["max"] or m) - m for m, s in zip(med, rows)]
        axes[0].errorbar(x, med, yerr=[lo, hi], marker="o", capsize=2, label=config, color=f"C{i}")
        axes[1].plot(x, [s.get("speedup") or 0.0 for s in rows], marker="o", label=config, color=f"C{i}")
        axes[2].plot(
            x, [(s.get("latency_ms") or {}).get("p95") or 0.0 for s in rows], marker="o", label=config, color=f"C{i}"
        )
    axes[0].set_ylabel("aggregate tokens/s")
    axes[0].legend(fontsize=8, ncol=min(4, len(configs)))
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylabel("speedup vs plain")
    axes[2].set_ylabel("p95 latency (ms)")
    axes[2].set_xlabel("clients in flight (-np)")
    axes[2].set_xscale("log", base=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    head = "dspark bench --concurrency: aggregate tok/s, speedup and p95 latency"
    head = f"{synthetic_note(summaries) or REAL_LABEL}\n" + head
    fig.suptitle(head, fontsize=10, color="red" if is_synthetic(summaries) else "black")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
