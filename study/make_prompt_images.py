#!/usr/bin/env python3
"""Render the PNGs of dspark's prompt kit (dsparkcli/data/prompts/images/).

Every image is drawn here with matplotlib from fixed numbers and fixed seeds, so the kit is
reproducible and owes nothing to any dataset. The PNGs are quantised to a small palette to keep
the whole kit well under 1.5 MB.

    python -m study.make_prompt_images            # writes into the package data folder
    python -m study.make_prompt_images --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import patches  # noqa: E402
from PIL import Image  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "dsparkcli" / "data" / "prompts" / "images"
SIZE_IN = (5.0, 3.75)  # 400 x 300 px at DPI 80
DPI = 80


def _fig(size: tuple[float, float] = SIZE_IN):
    fig = plt.figure(figsize=size, dpi=DPI)
    return fig


def _diagram(equal: bool = False):
    """A blank full-figure 10 x 7.5 canvas without axes: the frame every drawn diagram starts from."""
    fig = _fig()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 7.5)
    if equal:
        ax.set_aspect("equal")
    ax.set_axis_off()
    return fig, ax


def _save(fig, path: Path, colors: int = 48) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    buf.seek(0)
    img = (
        Image.open(buf)
        .convert("RGB")
        .quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    )
    img.save(path, format="PNG", optimize=True)


def _text_image(
    lines: list[str],
    path: Path,
    *,
    family: str = "DejaVu Sans",
    size: int = 11,
    box: bool = False,
    title: str | None = None,
) -> None:
    fig = _fig()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_axis_off()
    y = 0.93
    if title:
        ax.text(0.5, y, title, ha="center", va="top", fontsize=size + 3, fontweight="bold", family=family)
        y -= 0.12
    for line in lines:
        ax.text(0.06, y, line, ha="left", va="top", fontsize=size, family=family)
        y -= 0.075
    if box:
        ax.add_patch(patches.Rectangle((0.02, 0.02), 0.96, 0.96, fill=False, lw=2))
    _save(fig, path, colors=16)


# ------------------------------------------------------------------ mmmu-style (college diagrams)


def mmmu_circuit(p: Path) -> None:
    fig, ax = _diagram()
    ax.plot([1.5, 1.5, 8.5, 8.5, 1.5], [1, 6, 6, 1, 1], color="k", lw=2)  # outer loop
    ax.plot([5.5, 5.5], [1, 6], color="k", lw=2)  # the parallel branch
    ax.add_patch(patches.Rectangle((1.1, 3.0), 0.8, 1.2, fc="white", ec="white"))
    ax.plot([1.15, 1.85], [3.9, 3.9], color="k", lw=3)  # battery plates: long (+) and short (-)
    ax.plot([1.3, 1.7], [3.3, 3.3], color="k", lw=3)
    ax.text(2.1, 3.6, "12 V", ha="left", va="center", fontsize=11)
    ax.add_patch(patches.Rectangle((2.7, 5.7), 1.6, 0.6, fc="white", ec="k", lw=2))
    ax.text(3.5, 6.6, "R1 = 4 Ω", ha="center", fontsize=11)
    ax.add_patch(patches.Rectangle((5.2, 2.8), 0.6, 1.6, fc="white", ec="k", lw=2))
    ax.text(5.0, 3.6, "R2 = 6 Ω", ha="right", va="center", fontsize=11)
    ax.add_patch(patches.Rectangle((8.2, 2.8), 0.6, 1.6, fc="white", ec="k", lw=2))
    ax.text(8.0, 3.6, "R3 = 3 Ω", ha="right", va="center", fontsize=11)
    ax.text(5, 0.4, "Figure 1: a battery, R1 in series, R2 parallel to R3", ha="center", fontsize=10)
    _save(fig, p, colors=8)


def mmmu_supply_demand(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.13, 0.14, 0.82, 0.78])
    q = np.linspace(0, 100, 50)
    ax.plot(q, 80 - 0.6 * q, label="Demand", lw=2)
    ax.plot(q, 20 + 0.4 * q, label="Supply", lw=2)
    ax.plot(q, 30 + 0.4 * q, "--", label="Supply after tax", lw=2)
    ax.set_xlabel("Quantity (thousand units)")
    ax.set_ylabel("Price ($)")
    ax.set_title("Market for bicycle helmets")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, p)


def mmmu_incline(p: Path) -> None:
    fig, ax = _diagram(equal=True)
    ax.add_patch(patches.Polygon([[1, 1], [9, 1], [9, 5.6]], closed=True, fc="#dddddd", ec="k"))
    ang = np.arctan2(4.6, 8)
    c, s = np.cos(ang), np.sin(ang)
    base = np.array([5.0, 1 + 4 * np.tan(ang)])
    box = [base, base + [c, s], base + [c - s, s + c], base + [-s, c]]
    ax.add_patch(patches.Polygon(box, closed=True, fc="#8fb3e0", ec="k"))
    ax.text(2.2, 1.2, "30°", fontsize=12)
    ax.text(6.6, 3.3, "m = 2 kg", fontsize=11)
    center = base + 0.5 * np.array([c - s, s + c])
    ax.annotate("", xy=center + [0, -1.8], xytext=center, arrowprops=dict(arrowstyle="->", lw=2))
    ax.text(center[0] + 0.1, center[1] - 2.0, "mg", fontsize=11)
    ax.annotate("", xy=center + 1.6 * np.array([-s, c]), xytext=center, arrowprops=dict(arrowstyle="->", lw=2))
    ax.text(*(center + 1.7 * np.array([-s, c])), "N", fontsize=11)
    ax.text(5, 0.3, "μk = 0.2 between block and incline", ha="center", fontsize=10)
    _save(fig, p, colors=8)


def mmmu_food_web(p: Path) -> None:
    fig, ax = _diagram()
    nodes = {
        "Grass": (2, 1),
        "Algae": (7.5, 1),
        "Rabbit": (1, 3.5),
        "Grasshopper": (3.5, 3.2),
        "Snail": (7.5, 3.2),
        "Frog": (5, 4.8),
        "Fox": (2, 6.3),
        "Heron": (7, 6.3),
    }
    edges = [
        ("Grass", "Rabbit"),
        ("Grass", "Grasshopper"),
        ("Algae", "Snail"),
        ("Grasshopper", "Frog"),
        ("Snail", "Frog"),
        ("Rabbit", "Fox"),
        ("Frog", "Fox"),
        ("Frog", "Heron"),
        ("Snail", "Heron"),
    ]
    for a, b in edges:
        ax.annotate("", xy=nodes[b], xytext=nodes[a], arrowprops=dict(arrowstyle="->", lw=1.5, shrinkA=14, shrinkB=14))
    for name, (x, y) in nodes.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=10, bbox=dict(boxstyle="round", fc="#e8f4e0", ec="k"))
    ax.text(5, 7.2, "Pond-edge food web (arrows point from food to eater)", ha="center", fontsize=10)
    _save(fig, p, colors=12)


def mmmu_punnett(p: Path) -> None:
    fig, ax = _diagram()
    ax.text(5, 7.0, "Cross: Rr Yy  x  rr Yy", ha="center", fontsize=13, fontweight="bold")
    cols = ["rY", "ry"]
    rows = ["RY", "Ry", "rY", "ry"]
    ax.text(5.8, 6.2, "gametes of parent 2", ha="center", fontsize=9)
    for j, g in enumerate(cols):
        ax.text(4.6 + 2.4 * j, 5.7, g, ha="center", fontsize=12, fontweight="bold")
    for i, g in enumerate(rows):
        y = 4.9 - 1.1 * i
        ax.text(3.0, y, g, ha="center", va="center", fontsize=12, fontweight="bold")
        for j, h in enumerate(cols):
            x = 3.4 + 2.4 * j
            ax.add_patch(patches.Rectangle((x, y - 0.55), 2.4, 1.1, fill=False, lw=1.5))
            geno = "".join(sorted(g[0] + h[0], key=lambda t: (t.lower(), t.islower()))) + "".join(
                sorted(g[1] + h[1], key=lambda t: (t.lower(), t.islower()))
            )
            if i == 1 and j == 0:
                geno = "?"
            ax.text(x + 1.2, y, geno, ha="center", va="center", fontsize=12)
    ax.text(1.2, 3.2, "gametes\nof\nparent 1", ha="center", fontsize=9)
    _save(fig, p, colors=8)


def mmmu_timeline(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.25, 0.15, 0.7, 0.75])
    eras = [
        ("Bronze Age (region A)", -3300, -1200),
        ("Iron Age (region A)", -1200, -550),
        ("Classical period", -550, 330),
        ("Late antiquity", 250, 650),
        ("Early medieval", 500, 1000),
    ]
    for i, (_, a, b) in enumerate(eras):
        ax.barh(i, b - a, left=a, color=f"C{i}")
    ax.set_yticks(range(len(eras)))
    ax.set_yticklabels([e[0] for e in eras], fontsize=8)
    ax.set_xlabel("Year (negative = BCE)")
    ax.set_title("Periods of a fictional region")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, p)


# ------------------------------------------------------------------ mathvista-style


def mv_triangle(p: Path) -> None:
    fig, ax = _diagram(equal=True)
    A, B, C = (1.5, 1.2), (8.5, 1.2), (3.5, 6.2)
    ax.add_patch(patches.Polygon([A, B, C], closed=True, fill=False, lw=2))
    ax.text(A[0] - 0.4, A[1] - 0.3, "A", fontsize=13)
    ax.text(B[0] + 0.1, B[1] - 0.3, "B", fontsize=13)
    ax.text(C[0] - 0.1, C[1] + 0.2, "C", fontsize=13)
    ax.text(2.3, 1.5, "68°", fontsize=12)
    ax.text(7.0, 1.5, "47°", fontsize=12)
    ax.text(3.4, 5.3, "x", fontsize=14, fontstyle="italic")
    ax.text(5.0, 0.5, "AB = 7 cm", ha="center", fontsize=11)
    _save(fig, p, colors=8)


def mv_parabola(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.12, 0.83, 0.8])
    x = np.linspace(-2, 6, 200)
    ax.plot(x, (x - 2) ** 2 - 3, lw=2, label="f(x)")
    ax.plot(x, 0.5 * x + 1, lw=2, label="g(x)")
    ax.axhline(0, color="k", lw=0.8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xticks(range(-2, 7))
    ax.set_yticks(range(-4, 14, 2))
    ax.grid(alpha=0.4)
    ax.legend(fontsize=9)
    ax.set_title("Two functions")
    _save(fig, p)


def mv_bar_counts(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.15, 0.83, 0.75])
    names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    vals = [14, 22, 9, 17, 25, 31]
    bars = ax.bar(names, vals, color="#4c72b0")
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, v + 0.5, str(v), ha="center", fontsize=10)
    ax.set_ylabel("Books borrowed")
    ax.set_title("Library loans in one week")
    _save(fig, p, colors=12)


def mv_circle_square(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-5, 5)
    ax.set_ylim(-3.75, 3.75)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.add_patch(patches.Circle((0, 0), 3, fill=False, lw=2))
    r = 3 / np.sqrt(2)
    ax.add_patch(
        patches.Polygon([(-r, -r), (r, -r), (r, r), (-r, r)], closed=True, fill=True, fc="#f2c14e", ec="k", lw=2)
    )
    ax.plot([0, 3], [0, 0], "k--")
    ax.text(1.5, 0.15, "r = 3", ha="center", fontsize=12)
    ax.plot(0, 0, "ko", ms=3)
    _save(fig, p, colors=8)


def mv_scatter(p: Path) -> None:
    rng = np.random.default_rng(7)
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.83, 0.78])
    hours = rng.uniform(0, 10, 24)
    score = 48 + 4.5 * hours + rng.normal(0, 5, 24)
    ax.scatter(hours, score, s=18)
    xs = np.linspace(0, 10, 2)
    ax.plot(xs, 48 + 4.5 * xs, "r-", lw=1.5, label="fit: y = 4.5x + 48")
    ax.set_xlabel("Hours studied")
    ax.set_ylabel("Exam score")
    ax.legend(fontsize=9)
    ax.grid(alpha=0.3)
    _save(fig, p)


def mv_clock(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-1.2, 1.2)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.add_patch(patches.Circle((0, 0), 1, fill=False, lw=3))
    for h in range(1, 13):
        a = np.pi / 2 - h * np.pi / 6
        ax.text(0.82 * np.cos(a), 0.82 * np.sin(a), str(h), ha="center", va="center", fontsize=12)
    hour, minute = 4, 40
    am = np.pi / 2 - minute * np.pi / 30
    ah = np.pi / 2 - (hour + minute / 60) * np.pi / 6
    ax.plot([0, 0.7 * np.cos(am)], [0, 0.7 * np.sin(am)], "k-", lw=2)
    ax.plot([0, 0.45 * np.cos(ah)], [0, 0.45 * np.sin(ah)], "k-", lw=4)
    _save(fig, p, colors=8)


# ------------------------------------------------------------------ charxiv-style (chart reasoning)


def cx_lines(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.83, 0.78])
    years = np.arange(2015, 2025)
    ax.plot(years, [12, 14, 15, 19, 22, 21, 26, 30, 33, 35], "o-", label="Solar")
    ax.plot(years, [30, 31, 33, 32, 34, 35, 35, 36, 38, 37], "s-", label="Wind")
    ax.plot(years, [40, 38, 37, 35, 31, 30, 27, 22, 20, 18], "^-", label="Coal")
    ax.set_ylabel("Share of new capacity (%)")
    ax.set_title("Capacity added per year (fictional grid)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, p)


def cx_grouped_bars(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.83, 0.76])
    models = ["Model A", "Model B", "Model C", "Model D"]
    x = np.arange(4)
    ax.bar(x - 0.2, [71.2, 64.8, 80.1, 58.3], 0.4, label="Benchmark 1")
    ax.bar(x + 0.2, [66.0, 69.5, 74.4, 61.7], 0.4, label="Benchmark 2")
    ax.set_xticks(x)
    ax.set_xticklabels(models)
    ax.set_ylim(50, 85)
    ax.set_ylabel("Accuracy (%)")
    ax.legend(fontsize=8)
    ax.set_title("Accuracy on two benchmarks")
    _save(fig, p)


def cx_stacked_area(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.83, 0.78])
    months = np.arange(1, 13)
    a = np.array([5, 6, 8, 10, 13, 16, 18, 18, 15, 11, 8, 6])
    b = np.array([10, 10, 11, 12, 12, 13, 13, 13, 12, 11, 10, 10])
    c = np.array([3, 3, 4, 4, 5, 7, 9, 9, 6, 4, 3, 3])
    ax.stackplot(months, a, b, c, labels=["Cooling", "Base load", "Pumps"], alpha=0.8)
    ax.set_xticks(months)
    ax.set_xlabel("Month")
    ax.set_ylabel("Energy use (MWh)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Monthly energy use of a building")
    _save(fig, p)


def cx_heatmap(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.15, 0.12, 0.65, 0.78])
    data = np.array(
        [[0.91, 0.72, 0.40, 0.15], [0.80, 0.85, 0.52, 0.22], [0.55, 0.61, 0.88, 0.47], [0.20, 0.33, 0.58, 0.93]]
    )
    im = ax.imshow(data, cmap="viridis", vmin=0, vmax=1)
    for i in range(4):
        for j in range(4):
            ax.text(
                j, i, f"{data[i, j]:.2f}", ha="center", va="center", color="w" if data[i, j] < 0.6 else "k", fontsize=9
            )
    ax.set_xticks(range(4))
    ax.set_xticklabels(["en", "de", "fr", "ja"])
    ax.set_yticks(range(4))
    ax.set_yticklabels(["en", "de", "fr", "ja"])
    ax.set_xlabel("test language")
    ax.set_ylabel("train language")
    ax.set_title("Transfer score")
    cax = fig.add_axes([0.83, 0.12, 0.04, 0.78])
    fig.colorbar(im, cax=cax)
    _save(fig, p, colors=64)


def cx_boxplots(p: Path) -> None:
    rng = np.random.default_rng(3)
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.83, 0.78])
    groups = [rng.normal(m, s, 60) for m, s in ((20, 3), (24, 6), (18, 2), (27, 4))]
    ax.boxplot(groups)
    ax.set_xticks([1, 2, 3, 4])
    ax.set_xticklabels(["Site 1", "Site 2", "Site 3", "Site 4"])
    ax.set_ylabel("Latency (ms)")
    ax.set_title("Request latency by site")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, p, colors=16)


def cx_dual_axis(p: Path) -> None:
    fig = _fig()
    ax = fig.add_axes([0.12, 0.14, 0.74, 0.78])
    q = ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6"]
    rev = [3.1, 3.4, 3.9, 4.6, 4.4, 5.2]
    margin = [12, 11, 14, 17, 13, 18]
    ax.bar(q, rev, color="#88a", label="Revenue")
    ax.set_ylabel("Revenue (M€)")
    ax2 = ax.twinx()
    ax2.plot(q, margin, "r-o", label="Margin")
    ax2.set_ylabel("Margin (%)")
    ax2.set_ylim(0, 20)
    ax.set_title("Revenue and margin by quarter")
    _save(fig, p)


# ------------------------------------------------------------------ OCR


def ocr_receipt(p: Path) -> None:
    _text_image(
        [
            "CORNER BAKERY  #0417",
            "2 x Rye loaf            7.80",
            "1 x Cinnamon roll       2.95",
            "3 x Oat cookie          4.50",
            "1 x Flat white          3.40",
            "Subtotal               18.65",
            "VAT 7%                  1.31",
            "TOTAL                  19.96",
            "Paid by card ****5521",
        ],
        p,
        family="DejaVu Sans Mono",
        size=11,
        box=True,
        title="RECEIPT",
    )


def ocr_notice(p: Path) -> None:
    _text_image(
        [
            "The north entrance will be closed",
            "from Monday 3 March to Friday 14 March",
            "for repairs to the staircase.",
            "",
            "Please use the east entrance on",
            "Wharf Lane.",
            "Lifts remain available 07:00-22:00.",
        ],
        p,
        size=13,
        box=True,
        title="NOTICE TO VISITORS",
    )


def ocr_timetable(p: Path) -> None:
    _text_image(
        [
            "Stop            Bus 12   Bus 12   Bus 40",
            "Harbour Sq.     06:55    07:25    07:40",
            "Mill Road       07:03    07:33    07:51",
            "Station         07:12    07:42    --",
            "Hospital        07:20    07:50    08:04",
            "University      07:31    08:01    08:15",
        ],
        p,
        family="DejaVu Sans Mono",
        size=11,
        title="Weekday timetable",
    )


def ocr_paragraph(p: Path) -> None:
    _text_image(
        [
            "Dear Ms. Okafor,",
            "",
            "Thank you for returning the signed lease.",
            "Your keys can be collected from the office",
            "on Thursday after 2 pm. The deposit of",
            "950 pounds was received on 11 June.",
            "",
            "Kind regards,",
            "P. Lindqvist",
        ],
        p,
        family="DejaVu Serif",
        size=12,
    )


def ocr_code(p: Path) -> None:
    _text_image(
        [
            "def moving_average(xs, k):",
            "    out = []",
            "    total = sum(xs[:k])",
            "    out.append(total / k)",
            "    for i in range(k, len(xs)):",
            "        total += xs[i] - xs[i - k]",
            "        out.append(total / k)",
            "    return out",
        ],
        p,
        family="DejaVu Sans Mono",
        size=12,
        title="snippet.py",
    )


def ocr_form(p: Path) -> None:
    _text_image(
        [
            "Name:            Tomasz Wierzbicki",
            "Date of birth:   1987-09-23",
            "Membership no.:  LX-20931",
            "Plan:            Family (2 adults, 1 child)",
            "Start date:      01/04/2025",
            "Monthly fee:     EUR 64.00",
            "Signature:       T. Wierzbicki",
        ],
        p,
        family="DejaVu Sans Mono",
        size=11,
        box=True,
        title="MEMBERSHIP FORM",
    )


IMAGES = {
    "mmmu_circuit.png": mmmu_circuit,
    "mmmu_supply_demand.png": mmmu_supply_demand,
    "mmmu_incline.png": mmmu_incline,
    "mmmu_food_web.png": mmmu_food_web,
    "mmmu_punnett.png": mmmu_punnett,
    "mmmu_timeline.png": mmmu_timeline,
    "mv_triangle.png": mv_triangle,
    "mv_parabola.png": mv_parabola,
    "mv_bar_counts.png": mv_bar_counts,
    "mv_circle_square.png": mv_circle_square,
    "mv_scatter.png": mv_scatter,
    "mv_clock.png": mv_clock,
    "cx_lines.png": cx_lines,
    "cx_grouped_bars.png": cx_grouped_bars,
    "cx_stacked_area.png": cx_stacked_area,
    "cx_heatmap.png": cx_heatmap,
    "cx_boxplots.png": cx_boxplots,
    "cx_dual_axis.png": cx_dual_axis,
    "ocr_receipt.png": ocr_receipt,
    "ocr_notice.png": ocr_notice,
    "ocr_timetable.png": ocr_timetable,
    "ocr_paragraph.png": ocr_paragraph,
    "ocr_code.png": ocr_code,
    "ocr_form.png": ocr_form,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, draw in IMAGES.items():
        path = args.out / name
        draw(path)
        total += path.stat().st_size
    print(f"wrote {len(IMAGES)} images, {total / 1024:.0f} KiB, to {args.out}")


if __name__ == "__main__":
    main()
