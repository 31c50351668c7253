"""Render bench summaries: table rows, CSV, Markdown, the --json document and a PNG plot.

Input is the typed rows (``bench.summaries``) ``bench.run`` measured, or ``bench.stats.summarize``
recomputes from a JSONL file, with the run's provenance block (where a plain-only or scripted run's
synthetic label comes from, given once in the --json document); a --concurrency run's
``LoadSummaryRecord`` rows have their own columns (``LOAD_COLUMNS``), a line per configuration x
concurrency, and the crossover (where a draft stops paying). A run with ``--spec-synth-len`` is
labelled synthetic in every format. The --json document's rows are ``to_record()``: the JSONL lines'
schema, byte for byte (tests/test_report_golden.py).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsparkcli.bench.summaries import LoadSummaryRecord, Quantiles, Spread, Summary, SummaryRecord

Provenance = Mapping[str, Any]  # a run's provenance block (bench.provenance), as its lines carry it

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


def is_load(summaries: Sequence[Summary]) -> bool:
    """A --concurrency run's rows (``load_summary``)."""
    return any(isinstance(s, LoadSummaryRecord) for s in summaries)


def is_synthetic(summaries: Sequence[Summary]) -> bool:
    return any(s.synthetic for s in summaries)


def synth_len_of(summaries: Sequence[Summary], provenance: Provenance | None = None) -> float | None:
    found = next((s.synth_len for s in summaries if s.synth_len is not None), None)
    if found is None and summaries and provenance:  # plain-only rows: the run-level setting is in the provenance
        found = provenance.get("synth_len")
    return float(found) if found is not None else 0.0


SCRIPTED_LABEL = "SYNTHETIC acceptance ({why}): a scripted pair, not a real draft"
REAL_LABEL = "REAL acceptance: a real draft on a real target"


def synthetic_note(summaries: Sequence[Summary], provenance: Provenance | None = None) -> str | None:
    """Why a run's figures are synthetic (emulated with --spec-synth-len, or a scripted pair), or None."""
    if not is_synthetic(summaries):
        return None
    prov = provenance or {}
    if prov.get("synth_len") is None and all(s.synth_len is None for s in summaries):
        return SCRIPTED_LABEL.format(why=prov.get("acceptance_why") or "a dspark synth pair")
    return SYNTHETIC_LABEL.format(L=f"{synth_len_of(summaries, provenance):g}")


INTERRUPTED_LABEL = "INTERRUPTED, what was measured so far"


def title(summaries: Sequence[Summary], provenance: Provenance | None = None, *, partial: bool = False) -> str:
    """The table's title; ``partial``: an interrupted run's rows, which every format says first."""
    base = "dspark bench: plain vs draft budgets (greedy; median over reps, min-max)"
    if is_load(summaries):
        base = (
            "dspark bench --concurrency: N clients in flight on llama-server -np N (greedy, streamed; "
            "aggregate tok/s median over passes, min-max; speedup vs plain at the same N)"
        )
    note = synthetic_note(summaries, provenance) or REAL_LABEL
    return (f"{INTERRUPTED_LABEL}: " if partial else "") + f"{base}. {note}"


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


def _divergences(s: Summary, limit: int = 3) -> str:
    div = s.drafting.divergent if s.drafting else ()
    if not div:
        return "-"
    parts = [f"{d.prompt_id}@{d.first_divergence if d.first_divergence is not None else '?'}" for d in div[:limit]]
    return ", ".join(parts) + (f" +{len(div) - limit}" if len(div) > limit else "")


PER_POS_SHOWN = 8  # an n-gram draft's positions run to 64: past this many, the trailing zeros are cut ("+N")


def _per_pos(s: Summary) -> str:
    values = s.drafting.acceptance_per_pos if s.drafting else []
    if not values:
        return "-"
    shown = values
    if len(values) > PER_POS_SHOWN:
        last = max((i for i, v in enumerate(values) if v > 0), default=-1)
        shown = values[: max(PER_POS_SHOWN, last + 1)]
    cut = len(values) - len(shown)
    return " ".join(f"{100 * v:.0f}" for v in shown) + (f" +{cut}x0" if cut else "")


def _speedup(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table_rows(summaries: Sequence[SummaryRecord]) -> list[tuple[str, ...]]:
    """One row of strings per summary, in COLUMNS order."""
    rows = []
    for s in summaries:
        t, d = s.tok_s, s.drafting
        rows.append(
            (
                s.config,
                s.category,
                _tok(t.median),
                f"{_tok(t.min)}-{_tok(t.max)}",
                _speedup(s.speedup),
                "-" if d is None else str(d.total.drafted),
                "-" if d is None else str(d.total.accepted),
                "-" if d is None else _rate(d.total.acceptance_rate),
                "-" if d is None else _num(d.counters.mean_length),
                _num(s.upstream_acceptance_length, 3),
                "-" if d is None else f"{d.identical}/{d.prompts}",
                "-" if d is None else _divergences(s),
                "-" if d is None else _per_pos(s),
            )
        )
    return rows


def _ms(q: Quantiles) -> str:
    return "/".join("-" if v is None else f"{v:.1f}" for v in (q.p50, q.p95, q.max))


def load_table_rows(summaries: Sequence[LoadSummaryRecord]) -> list[tuple[str, ...]]:
    """One row of strings per load_summary, in LOAD_COLUMNS order."""
    rows = []
    for s in summaries:
        t, d = s.tok_s, s.drafting
        rows.append(
            (
                s.config,
                str(s.concurrency),
                _tok(t.median),
                f"{_tok(t.min)}-{_tok(t.max)}",
                _speedup(s.speedup),
                _tok(s.request_tok_s.median),
                _ms(s.ttft_ms),
                _ms(s.latency_ms),
                "-" if d is None else _num(d.counters.mean_length),
                "-" if d is None else _rate(d.total.acceptance_rate),
                "-" if d is None else f"{d.identical}/{d.prompts}",
            )
        )
    return rows


def crossover_note(summaries: Sequence[LoadSummaryRecord]) -> str:
    """Where each draft stops paying, in one line (a --concurrency run)."""
    top = {s.config: s.concurrency for s in sorted(summaries, key=lambda s: s.concurrency)}

    def clients(n: int) -> str:
        return f"{n} client" + ("s" if n != 1 else "")

    parts = [
        f"{c}: slower than plain from {clients(n)}"
        if n is not None
        else f"{c}: faster than plain at every N measured (up to {clients(top[c])})"
        for c, n in crossover(summaries).items()
    ]
    return "crossover: " + ("; ".join(parts) if parts else "no draft configuration")


def _drafting_fields(s: Summary) -> dict[str, Any]:
    """The CSV columns a draft configuration adds (empty for plain decoding)."""
    d = s.drafting
    if d is None:
        return {}
    return {
        "drafted": d.total.drafted,
        "accepted": d.total.accepted,
        "steps": d.counters.steps,
        "acceptance_rate": d.total.acceptance_rate,
        "mean_length": d.counters.mean_length,
        "identical": d.identical,
        "identical_pct": d.identical_pct,
    }


def flat(s: SummaryRecord) -> dict[str, Any]:
    """One summary as a flat dict of CSV_FIELDS."""
    t, d, drafting = s.tok_s, s.drafting, _drafting_fields(s)
    return {
        "synthetic": s.synthetic,
        "synth_len": s.synth_len,
        "config": s.config,
        "draft": s.draft,
        "budget": s.budget,
        "category": s.category,
        "prompts": s.prompts,
        "reps": s.reps,
        "requests": s.requests,
        "tokens": s.tokens,
        "tok_s_median": t.median,
        "tok_s_min": t.min,
        "tok_s_max": t.max,
        "speedup": s.speedup,
        **{k: drafting.get(k) for k in ("drafted", "accepted", "steps", "acceptance_rate", "mean_length")},
        "upstream_acceptance_length": s.upstream_acceptance_length,
        **{k: drafting.get(k) for k in ("identical", "identical_pct")},
        "first_divergences": ";".join(f"{v.prompt_id}@{v.first_divergence}" for v in (d.divergent if d else ())),
        "acceptance_per_pos": " ".join(f"{v:.4f}" for v in (d.acceptance_per_pos if d else ())),
    }


def load_flat(s: LoadSummaryRecord) -> dict[str, Any]:
    """One load_summary as a flat dict of LOAD_CSV_FIELDS."""
    row: dict[str, Any] = {
        "synthetic": s.synthetic,
        "synth_len": s.synth_len,
        "config": s.config,
        "draft": s.draft,
        "budget": s.budget,
        "concurrency": s.concurrency,
        "prompts": s.prompts,
        "reps": s.reps,
        "requests": s.requests,
        "tokens": s.tokens,
        "speedup": s.speedup,
    }
    for block, spread in (("tok_s", s.tok_s), ("request_tok_s", s.request_tok_s)):
        row.update({f"{block}_median": spread.median, f"{block}_min": spread.min, f"{block}_max": spread.max})
    for block, q in (("ttft_ms", s.ttft_ms), ("latency_ms", s.latency_ms)):
        row.update({f"{block}_p50": q.p50, f"{block}_p95": q.p95, f"{block}_max": q.max})
    drafting = _drafting_fields(s)
    row.update({k: drafting.get(k) for k in LOAD_CSV_FIELDS if k not in row})
    return {k: row[k] for k in LOAD_CSV_FIELDS}


def _load_rows(summaries: Sequence[Summary]) -> list[LoadSummaryRecord]:
    return [s for s in summaries if isinstance(s, LoadSummaryRecord)]


def _rows(summaries: Sequence[Summary]) -> list[SummaryRecord]:
    return [s for s in summaries if isinstance(s, SummaryRecord)]


def to_csv(summaries: Sequence[Summary]) -> str:
    buf = io.StringIO()
    load = is_load(summaries)
    w = csv.DictWriter(buf, fieldnames=LOAD_CSV_FIELDS if load else CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    flats = [load_flat(s) for s in _load_rows(summaries)] if load else [flat(s) for s in _rows(summaries)]
    for row in flats:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def to_markdown(summaries: Sequence[Summary], provenance: Provenance | None = None, *, partial: bool = False) -> str:
    load = is_load(summaries)
    columns = LOAD_COLUMNS if load else COLUMNS
    lines = [
        f"**{title(summaries, provenance, partial=partial)}**",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in load_table_rows(_load_rows(summaries)) if load else table_rows(_rows(summaries)):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    if load:
        lines += ["", crossover_note(_load_rows(summaries))]
    return "\n".join(lines) + "\n"


def to_json_doc(
    summaries: Sequence[Summary],
    provenance: Provenance | None = None,
    *,
    run_id: str,
    out: Path,
    overhead: Mapping[str, Any],
    partial: bool = False,
) -> dict[str, Any]:
    """The --json document: the summary rows as their JSONL lines (``to_record``) without the run's
    provenance, which is given once; ``partial`` (an interrupted run) adds ``"partial": true`` and the
    table's INTERRUPTED title."""
    synth = is_synthetic(summaries)
    doc: dict[str, Any] = {
        "run_id": run_id,
        "jsonl": str(out),
        "synthetic": synth,
        "acceptance": "SYNTHETIC" if synth else "REAL",
        "synthetic_note": synthetic_note(summaries, provenance),
        "overhead": dict(overhead),
        "summaries": [s.to_record() for s in summaries],
        "provenance": provenance if summaries else None,
    }
    if is_load(summaries):
        doc["crossover"] = crossover(_load_rows(summaries))
    if partial:
        doc.update(partial=True, title=title(summaries, provenance, partial=True))
    return doc


def crossover(summaries: Sequence[LoadSummaryRecord]) -> dict[str, int | None]:
    """Per draft configuration: the lowest concurrency at which it is slower than plain (None: never)."""
    found: dict[str, int | None] = {}
    for s in sorted((s for s in summaries if s.drafting is not None), key=lambda s: s.concurrency):
        found.setdefault(s.config, None)
        if found[s.config] is None and s.speedup is not None and s.speedup < 1.0:
            found[s.config] = s.concurrency
    return found


def plot(summaries: Sequence[Summary], path: Path, provenance: Provenance | None = None) -> Path:
    """Grouped bars per category: tok/s (median, min-max whiskers) and speedup vs plain, per configuration
    (a --concurrency run: lines of aggregate tok/s, speedup and p95 latency against concurrency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    note = synthetic_note(summaries, provenance) or REAL_LABEL
    if is_load(summaries):
        return _plot_load(_load_rows(summaries), Path(path), plt, note)

    rows = _rows(summaries)
    configs = list(dict.fromkeys(s.config for s in rows))
    categories = list(dict.fromkeys(s.category for s in rows))
    by = {(s.config, s.category): s for s in rows}
    x = np.arange(len(categories))
    width = 0.8 / max(1, len(configs))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(7.0, 1.3 * len(categories) + 3), 7.5), sharex=True)
    for i, config in enumerate(configs):
        med, lo, hi, spd = [], [], [], []
        for c in categories:
            s = by.get((config, c))
            t = s.tok_s if s else Spread()
            m = t.median or 0.0
            med.append(m)
            lo.append(m - (t.min or m))
            hi.append((t.max or m) - m)
            spd.append((s.speedup or 0.0) if s else 0.0)
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
    head = f"{note}\ndspark bench: tok/s and speedup per configuration and category"
    fig.suptitle(head, fontsize=10, color="red" if is_synthetic(summaries) else "black")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_load(summaries: Sequence[LoadSummaryRecord], path: Path, plt: Any, note: str) -> Path:
    configs = list(dict.fromkeys(s.config for s in summaries))
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 9.5), sharex=True)
    for i, config in enumerate(configs):
        rows = sorted((s for s in summaries if s.config == config), key=lambda s: s.concurrency)
        x = [s.concurrency for s in rows]
        med = [s.tok_s.median or 0.0 for s in rows]
        lo = [m - (s.tok_s.min or m) for m, s in zip(med, rows)]
        hi = [(s.tok_s.max or m) - m for m, s in zip(med, rows)]
        axes[0].errorbar(x, med, yerr=[lo, hi], marker="o", capsize=2, label=config, color=f"C{i}")
        axes[1].plot(x, [s.speedup or 0.0 for s in rows], marker="o", label=config, color=f"C{i}")
        axes[2].plot(x, [s.latency_ms.p95 or 0.0 for s in rows], marker="o", label=config, color=f"C{i}")
    axes[0].set_ylabel("aggregate tokens/s")
    axes[0].legend(fontsize=8, ncol=min(4, len(configs)))
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylabel("speedup vs plain")
    axes[2].set_ylabel("p95 latency (ms)")
    axes[2].set_xlabel("clients in flight (-np)")
    axes[2].set_xscale("log", base=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    head = f"{note}\ndspark bench --concurrency: aggregate tok/s, speedup and p95 latency"
    fig.suptitle(head, fontsize=10, color="red" if is_synthetic(summaries) else "black")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
