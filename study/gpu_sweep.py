#!/usr/bin/env python3
"""Speedup vs acceptance length x budget on a full-width synthetic pair (issue 8). SYNTHETIC acceptance.

One llama-server per configuration (``--spec-synth-len`` and ``--spec-draft-n-max`` are server flags
in this llama.cpp), each loaded, warmed up, then timed on greedy ``/completion`` requests with
``ignore_eos`` and fixed seeds. Everything is appended to a JSONL file as it is measured, so a call
that runs out of time still returns what it did. Records (all with ``run_id`` and ``synthetic: true``):

* ``provenance``  once: dspark version, engine commit/backend, GPU, argv, manifest, file sha256
* ``hbm``         (from ``--phase hbm``) device copy bandwidth measured with torch
* ``load_probe``  load time of the target with ``-lm none`` vs mmap (which one the sweep then uses)
* ``verify_cost`` prompt eval of m fresh tokens on the plain server: t_verify(m) for the bound
* ``request``     one per timed request: tok/s, predicted_ms, draft_n/accepted, steps (from /metrics),
                  draft time and calls (from the server's speculative statistics, ``-lv 4``)
* ``config``      one per server: load_s, medians/min/max per n_predict, t_step, t_draft, argv
                  (with ``--with-cost`` also L = 1 "cost" cells and L = k+1 "full" cells; with ``--loads N``
                  a ``load_round`` field: a load-to-load replicate study of the ``--only`` configurations)
* ``overhead``    dspark's client vs a bare HTTP client on the plain server (if time is left)
* ``skipped``     configurations the deadline left out

Usage (the study script calls this):
    python -m study.gpu_sweep --manifest DIR/manifest-*.json --out $OUT/sweep.jsonl --quick --deadline EPOCH
    python -m study.gpu_sweep --phase hbm --out $OUT/sweep.jsonl
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only modules without third-party dependencies at the top: `--phase hbm` runs with the GPU machine's own
# Python packages (study/plans/sweep.toml's doctor-hbm leg), which need not hold dspark's; the server side
# is imported where used.
from dsparkcli import __version__
from dsparkcli.bench.records import JsonlSink
from dsparkcli.bench.stats import spread
from dsparkcli.llama import protocol

if TYPE_CHECKING:
    from dsparkcli.llama.server import ServerConfig

SCHEMA = "dspark-gpu-sweep/1"
# upstream acceptance lengths per category (upstream_facts.md; BF16 pair, self-reported)
CATEGORIES: dict[str, float] = {
    "general": 3.501,
    "ocr": 5.407,
    "mmmu": 5.098,
    "charxiv": 5.479,
    "mathvista": 6.126,
    "math": 6.687,
    "code": 7.387,
}
BUDGETS = (1, 2, 3, 5, 7, 10, 15)
_STATS_RE = re.compile(
    r"statistics\s+draft-dspark: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?"
    r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms"
)


@dataclass(frozen=True)
class Config:
    # a CATEGORIES key; "plain"; "cost" (L = 1: every draft rejected, so one token per step and the
    # step cost t_verify(k+1) + t_draft(k) is measured apart from any acceptance); or "full" (L = k + 1:
    # every draft accepted, for budgets below every category's L - 1)
    category: str
    synth_len: float | None
    budget: int | None
    n_predict: tuple[int, ...] = ()  # empty: the sweep's --n-predict

    @property
    def key(self) -> str:
        if self.budget is None:
            return "plain"
        return f"L{self.synth_len:g}-k{self.budget}"


def grid(
    budgets: tuple[int, ...], categories: dict[str, float], with_cost: bool, cost_n_predict: tuple[int, ...] = (128,)
) -> list[Config]:
    """Spec configurations, most informative first: budgets near each L before far ones, then (with_cost)
    the all-rejected step-cost cells at every budget, then all-accepted cells for budgets no L reaches."""
    cells = [Config(cat, L, k) for cat, L in categories.items() for k in budgets if k >= L - 1]
    cells.sort(key=lambda c: (abs(c.budget - (c.synth_len + 1)), c.synth_len))  # type: ignore[operator]
    if with_cost:
        # at L = 1 a step yields one token, so these run at 1/t_step: fewer tokens keep them affordable
        cells += [Config("cost", 1.0, k, cost_n_predict) for k in budgets]
        covered = {c.budget for c in cells if c.category in categories}
        cells += [Config("full", float(k + 1), k) for k in budgets if k not in covered]
    return cells


class Sink:
    """This script's records (schema, type, run_id, ts) on bench's line-per-record file writer, fsynced:
    a killed call keeps everything written so far."""

    def __init__(self, path: Path, run_id: str, mirror: Path | None = None) -> None:
        self.lines = JsonlSink(path, mirrors=[mirror] if mirror else [], compact=False, fsync=True)
        self.run_id = run_id

    def write(self, rtype: str, **fields: Any) -> dict[str, Any]:
        rec = {
            "schema": SCHEMA,
            "type": rtype,
            "run_id": self.run_id,
            "synthetic": True,
            "ts": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **fields,
        }
        self.lines.write(rec)
        return rec


def measure_hbm(sink: Sink, gib: float = 4.0, reps: int = 20) -> None:
    """Device-to-device copy bandwidth: a copy reads and writes every byte, so 2 x size per copy."""
    import torch

    if not torch.cuda.is_available():
        sink.write("hbm", error="no CUDA device visible to torch")
        return
    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    moved = 2 * n * 4
    gbps = [moved / t / 1e9 for t in times]
    from dsparkcli.bench.provenance import gpu_facts  # needs platformdirs: see the imports at the top

    sink.write(
        "hbm",
        method="torch dst.copy_(src), bytes moved = 2 x size",
        size_bytes=n * 4,
        reps=reps,
        gb_per_s=spread(gbps, count=True),
        device=torch.cuda.get_device_name(0),
        torch_version=torch.__version__,
        gpu=gpu_facts(),
    )


# ------------------------------------------------------------------ servers


def _server_cfg(args: argparse.Namespace, pair: dict[str, Path], c: Config, load_mode: str) -> ServerConfig:
    from dsparkcli.llama.server import ServerConfig  # the server side: see the imports at the top

    extra: list[str] = []
    if load_mode != "auto":
        extra += ["-lm", load_mode]
    if c.budget is not None:
        extra += ["-lv", "4"]  # prints the speculative statistics (draft time) after each request
    extra += list(args.extra_arg or [])
    if args.cpu:
        extra += ["--no-repack"]  # a native build's AMX repack segfaults on these quantised files
    return ServerConfig(
        model=pair["target"],
        draft=pair["draft"] if c.budget is not None else None,
        n_max=c.budget,
        n_min=0 if c.budget is not None else None,
        p_min=0.0 if c.budget is not None else None,
        synth_len=c.synth_len,
        ngl=None if args.cpu else 99,
        ngld=None if (args.cpu or c.budget is None) else 99,
        flash_attn=None if args.cpu else "on",
        ctx=args.ctx,
        threads=args.threads if args.cpu else None,
        extra_args=tuple(extra),
    )


def _stats(log_path: Path | None, n_before: int, wait_s: float = 3.0) -> tuple[int, tuple[float, ...] | None]:
    """(count of statistics lines, last parsed (calls_b, calls_g, calls_a, ms_b, ms_g, ms_a)) once a new one appears."""
    deadline = time.monotonic() + wait_s
    while True:
        text = log_path.read_text(errors="replace") if log_path and log_path.is_file() else ""
        found = _STATS_RE.findall(text)
        if len(found) > n_before or time.monotonic() > deadline:
            last = tuple(float(x) for x in found[-1]) if found else None
            return len(found), last
        time.sleep(0.05)


def _payload(args: argparse.Namespace, prompt: list[int], n_predict: int, seed: int) -> dict[str, Any]:
    return protocol.completion_payload(prompt, n_predict=n_predict, seed=seed, ignore_eos=True, return_tokens=False)


def run_config(
    args,
    sink: Sink,
    engine,
    pair,
    files,
    c: Config,
    load_mode: str,
    prompt: list[int],
    plain_ref: dict[int, float] | None,
    load_round: int | None = None,
) -> dict[str, Any]:
    from dsparkcli.llama.server import LlamaServer  # the server side: see the imports at the top

    cfg = _server_cfg(args, pair, c, load_mode)
    t0 = time.monotonic()
    with LlamaServer(engine, cfg, log_dir=args.log_dir, startup_timeout=300) as srv:
        load_s = time.monotonic() - t0
        srv.client.completion(_payload(args, prompt, 32, 1))  # warm-up: graphs, allocations; not timed
        n_stats, last = _stats(srv.log_path, 0, wait_s=3.0 if c.budget is not None else 0.0)
        stats_wait = 3.0 if n_stats else 0.0  # no statistics line after the warm-up: do not wait for one again
        per_np: dict[int, list[dict[str, Any]]] = {}
        for n_predict in [n for n in (c.n_predict or args.n_predict) if (c.key, n) not in args.done]:
            for rep in range(args.reps):
                seed = args.seed + rep
                m0 = protocol.SpecCounters.from_metrics(srv.client.metrics())
                resp = srv.client.completion(_payload(args, prompt, n_predict, seed))
                moved = protocol.SpecCounters.from_metrics(srv.client.metrics()).minus(m0)
                tm = resp["timings"]
                steps = float(moved.steps)
                rec: dict[str, Any] = {
                    "config": c.key,
                    "category": c.category,
                    "synth_len": c.synth_len,
                    "budget": c.budget,
                    "n_predict": n_predict,
                    "seed": seed,
                    "rep": rep,
                    "predicted_n": tm["predicted_n"],
                    "predicted_ms": tm["predicted_ms"],
                    "tok_s": tm["predicted_per_second"],
                    "prompt_n": tm["prompt_n"],
                    "prompt_ms": tm["prompt_ms"],
                    "draft_n": tm.get("draft_n", 0),
                    "draft_n_accepted": tm.get("draft_n_accepted", 0),
                    "steps": steps,
                    "metrics_drafted": float(moved.drafted),
                    "metrics_accepted": float(moved.accepted),
                }
                if c.budget is not None:
                    rec["mean_len"] = protocol.mean_acceptance_length(rec["draft_n_accepted"], steps)
                    rec["t_step_ms"] = tm["predicted_ms"] / steps if steps else None
                    n_new, now = _stats(srv.log_path, n_stats, wait_s=stats_wait)
                    if now is not None and last is not None and n_new > n_stats:
                        calls, ms = now[1] - last[1], now[4] - last[4]
                        rec["draft_calls"], rec["t_draft_total_ms"] = calls, ms
                        rec["t_draft_ms"] = ms / calls if calls else None
                    n_stats, last = n_new, now
                else:
                    rec["t_step_ms"] = tm["predicted_ms"] / tm["predicted_n"]
                if plain_ref and n_predict in plain_ref:
                    rec["speedup_vs_plain"] = rec["tok_s"] / plain_ref[n_predict]
                sink.write("request", **rec)
                per_np.setdefault(n_predict, []).append(rec)
        verify = measure_verify_cost(args, sink, srv, c) if c.budget is None and load_round is None else None
        srv.check_alive()
        argv = srv.argv
    summary: dict[str, Any] = {
        "config": c.key,
        "category": c.category,
        "synth_len": c.synth_len,
        "budget": c.budget,
        "load_s": round(load_s, 3),
        "load_mode": load_mode,
        "server_argv": argv,
        "engine": {"commit": engine.commit, "backend": engine.backend, "version": engine.version},
        "gpu": args.gpu_name,
        "files": files,
        "by_n_predict": {},
    }
    for n_predict, recs in per_np.items():
        s = {
            "tok_s": spread([r["tok_s"] for r in recs], count=True),
            "t_step_ms": spread([r["t_step_ms"] for r in recs if r.get("t_step_ms")], count=True),
        }
        if c.budget is not None:
            s["mean_len"] = spread([r["mean_len"] for r in recs if r.get("mean_len")], count=True)
            s["t_draft_ms"] = spread([r["t_draft_ms"] for r in recs if r.get("t_draft_ms")], count=True)
            s["draft_n"] = sum(r["draft_n"] for r in recs)
            s["draft_n_accepted"] = sum(r["draft_n_accepted"] for r in recs)
            s["steps"] = sum(r["steps"] for r in recs)
        if plain_ref and n_predict in plain_ref:
            s["plain_tok_s_median"] = plain_ref[n_predict]
            s["speedup_median"] = s["tok_s"]["median"] / plain_ref[n_predict]
            s["speedup_min"] = s["tok_s"]["min"] / plain_ref[n_predict]
            s["speedup_max"] = s["tok_s"]["max"] / plain_ref[n_predict]
        summary["by_n_predict"][str(n_predict)] = s
    if verify:
        summary["verify_cost_ms"] = verify
    if load_round is not None:
        summary["load_round"] = load_round
    return sink.write("config", **summary)


def measure_verify_cost(args, sink: Sink, srv, c: Config) -> dict[str, float]:
    """t_verify(m): prompt eval of m fresh tokens (no cache) on the plain server, median of reps."""
    out: dict[str, float] = {}
    sizes = sorted({1} | {k + 1 for k in args.budgets})
    for m in sizes:
        ms = []
        for rep in range(args.verify_reps):
            prompt = [(17 + 31 * i + 7 * rep) % 1000 + 10 for i in range(m)]
            resp = srv.client.completion(
                protocol.completion_payload(prompt, n_predict=1, seed=0, ignore_eos=True, return_tokens=None)
            )
            if resp["timings"]["prompt_n"] == m:
                ms.append(resp["timings"]["prompt_ms"])
        sink.write(
            "verify_cost", m=m, prompt_ms=spread(ms, count=True), method="prompt eval of m fresh tokens, plain server"
        )
        if ms:
            out[str(m)] = statistics.median(ms)
    return out


def probe_load(args, sink: Sink, engine, pair) -> str:
    """Time a plain load with -lm none (read into pinned buffers) and with mmap; use the faster."""
    from dsparkcli.llama.server import LlamaServer  # the server side: see the imports at the top

    times = {}
    for mode in ("none", "mmap"):
        t0 = time.monotonic()
        with LlamaServer(engine, _server_cfg(args, pair, Config("plain", None, None), mode), log_dir=args.log_dir):
            times[mode] = time.monotonic() - t0
    best = min(times, key=times.get)  # type: ignore[arg-type]
    sink.write("load_probe", load_s=times, chosen=best, target_bytes=pair["target"].stat().st_size)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SYNTHETIC-acceptance speedup sweep on a full-width pair")
    ap.add_argument("--phase", choices=("sweep", "hbm"), default="sweep")
    ap.add_argument("--manifest", type=Path, help="manifest-*.json written by dsparkcli.synth_shapes")
    ap.add_argument("--out", type=Path, required=True, help="JSONL file (appended)")
    ap.add_argument("--quick", action="store_true", help="n_predict 256 only (default: 256 and 1024)")
    ap.add_argument("--n-predict", type=int, nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--verify-reps", type=int, default=5)
    ap.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    ap.add_argument("--categories", nargs="+", default=list(CATEGORIES), help="subset of: " + " ".join(CATEGORIES))
    ap.add_argument(
        "--with-cost",
        action="store_true",
        help="also run L = 1 (all rejected) at every budget, and L = k+1 where no category reaches k",
    )
    ap.add_argument("--cost-n-predict", type=int, nargs="+", default=[128], help="n_predict of the L = 1 cells")
    ap.add_argument("--part", type=int, default=1, help="this call's share of the grid (1-based)")
    ap.add_argument("--parts", type=int, default=1, help="how many calls share the grid")
    ap.add_argument("--deadline", type=float, default=0.0, help="unix time after which no new server starts")
    ap.add_argument("--load-mode", default="probe", help="probe | none | mmap | auto (llama-server -lm)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--cpu", action="store_true", help="CPU engine (smoke test): no -ngl/-fa, --no-repack")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default=None)
    ap.add_argument("--log-dir", type=Path, default=None)
    ap.add_argument("--extra-arg", action="append", help="extra llama-server argument (repeatable)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the dspark-vs-bare-client measurement")
    ap.add_argument("--run-id", default=None)
    ap.add_argument(
        "--loads",
        type=int,
        default=1,
        help="> 1: load-to-load variation: every --only configuration (and plain) in N interleaved "
        "rounds, one server load each, ratios against the same round's plain",
    )
    ap.add_argument("--only", nargs="+", default=None, help="configuration keys to run, e.g. L5.407-k5 L1-k7")
    ap.add_argument("--resume", type=Path, action="append", help="JSONL of an earlier call: skip its configurations")
    ap.add_argument(
        "--mirror",
        type=Path,
        default=None,
        help="also append every record here (a warm machine's /tmp: the next call resumes from it)",
    )
    args = ap.parse_args(argv)

    run_id = args.run_id or f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    sink = Sink(args.out, run_id, args.mirror if args.phase == "sweep" else None)
    if args.phase == "hbm":
        measure_hbm(sink)
        return 0

    from dsparkcli.bench.provenance import gpu_facts  # the server side: see the imports at the top
    from dsparkcli.llama import engine as engine_mod

    if args.manifest is None:
        ap.error("--manifest is required for the sweep")
    unknown = set(args.categories) - set(CATEGORIES)
    if unknown:
        ap.error(f"unknown categories: {', '.join(sorted(unknown))}")
    args.n_predict = args.n_predict or ([256] if args.quick else [256, 1024])
    args.done = set()  # (config key, n_predict) measured by an earlier call (--resume)
    args.budgets = tuple(sorted(set(args.budgets)))
    args.log_dir = args.log_dir or args.out.parent / "logs"
    man = json.loads(args.manifest.read_text())
    pair = {
        "target": args.manifest.parent / man["target"]["file"],
        "draft": args.manifest.parent / man["draft"]["file"],
    }
    files = {
        role: {
            "file": man[role]["file"],
            "bytes": man[role]["bytes"],
            "sha256": man[role]["sha256"],
            "sha256_source": "hashed while written (synth_shapes)",
        }
        for role in ("target", "draft")
    }
    engine = engine_mod.describe(engine_mod.resolve_engine(args.llama_bin))
    gpu = gpu_facts()
    args.gpu_name = gpu.get("name", "unknown")
    cats = {k: CATEGORIES[k] for k in args.categories}
    cells = grid(args.budgets, cats, args.with_cost, tuple(args.cost_n_predict))
    mine = cells[args.part - 1 :: args.parts]
    if args.only:
        by_key = {c.key: c for c in cells}
        unknown = [k for k in args.only if k not in by_key]
        if unknown:
            ap.error(f"--only: no such configuration: {', '.join(unknown)} (keys look like {cells[0].key})")
        mine = [by_key[k] for k in args.only]
    if args.loads > 1:
        args.resume = None  # a replicate study measures its configurations again on purpose
    if args.resume:  # configurations an earlier call already measured at the same n_predict set
        for path in args.resume:
            if not path.is_file():  # the first call on a fresh machine has no history yet
                continue
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("type") == "config" and r.get("budget") is not None:
                    args.done |= {(r["config"], int(n)) for n in r["by_n_predict"]}
        mine = [c for c in mine if any((c.key, n) not in args.done for n in (c.n_predict or args.n_predict))]
    sink.write(
        "provenance",
        dspark_version=__version__,
        argv=sys.argv if argv is None else argv,
        engine={
            "server": str(engine.server),
            "commit": engine.commit,
            "version": engine.version,
            "backend": engine.backend,
        },
        gpu=gpu,
        manifest=man,
        files=files,
        plan={
            "n_predict": args.n_predict,
            "reps": args.reps,
            "budgets": list(args.budgets),
            "categories": cats,
            "part": args.part,
            "parts": args.parts,
            "configs": [c.key + f"/{c.category}" for c in mine],
            "seed_base": args.seed,
            "loads": args.loads,
            "request": "greedy /completion, ignore_eos, cache_prompt false, 32-token id prompt, 1 warm-up",
        },
    )

    vocab = man["target"]["shape"]["vocab"]
    prompt = [(1009 * i + 7) % (vocab - 200) + 100 for i in range(32)]
    load_mode = probe_load(args, sink, engine, pair) if args.load_mode == "probe" else args.load_mode

    def left() -> float:
        return (args.deadline - time.time()) if args.deadline else float("inf")

    if args.loads > 1:
        return replicate(args, sink, engine, pair, files, mine, load_mode, prompt, left)
    try:
        plain = run_config(args, sink, engine, pair, files, Config("plain", None, None), load_mode, prompt, None)
    except Exception as e:  # no baseline, no ratios: say so and let the caller try another target
        sink.write(
            "error",
            config="plain",
            category="plain",
            error=f"{type(e).__name__}: {e}"[:2000],
            log_tail=getattr(e, "log_tail", "")[-4000:],
        )
        print(f"plain baseline failed: {e}", file=sys.stderr)
        return 6
    plain_ref = {int(k): v["tok_s"]["median"] for k, v in plain["by_n_predict"].items()}
    # what one spec configuration costs, to respect the deadline: a load + tokens at plain speed, padded;
    # raised to the slowest configuration seen so far (a budget far above L runs slower than plain)
    tokens = sum(args.n_predict) * args.reps + 32  # an upper bound when --resume leaves some out
    est = plain["load_s"] * 1.3 + tokens / max(plain_ref[min(plain_ref)], 1e-6) * 1.2 + 3.0
    for i, c in enumerate(mine):
        if left() < est:
            sink.write(
                "skipped",
                configs=[x.key + f"/{x.category}" for x in mine[i:]],
                reason=f"deadline: {left():.0f} s left, a configuration takes ~{est:.0f} s",
            )
            break
        t_start = time.monotonic()
        try:
            run_config(args, sink, engine, pair, files, c, load_mode, prompt, plain_ref)
        except Exception as e:  # one failing configuration must not lose the rest of the sweep
            sink.write(
                "error",
                config=c.key,
                category=c.category,
                error=f"{type(e).__name__}: {e}"[:2000],
                log_tail=getattr(e, "log_tail", "")[-4000:],
            )
        est = max(est, (time.monotonic() - t_start) * 1.1)
    if not args.no_overhead and left() > est + 30:
        measure_overhead(args, sink, engine, pair, load_mode)
    return 0


def replicate(
    args, sink: Sink, engine, pair, files, configs: list[Config], load_mode: str, prompt: list[int], left
) -> int:
    """Load-to-load variation: round r loads plain, then each configuration, each in its own server; every
    ratio is against round r's plain. Interleaving rounds keeps slow drift out of the comparison."""
    est = 0.0
    plain_ref: dict[int, float] = {}  # set by each round's plain load, which runs first (its failure ends the loop)
    for r in range(args.loads):
        for i, c in enumerate([Config("plain", None, None)] + configs):
            if left() < est:
                sink.write(
                    "skipped",
                    configs=[f"{x.key}/{x.category}" for x in configs[max(i - 1, 0) :]],
                    reason=f"deadline in round {r}: {left():.0f} s left, a load takes ~{est:.0f} s",
                )
                return 0
            t_start = time.monotonic()
            try:
                rec = run_config(
                    args,
                    sink,
                    engine,
                    pair,
                    files,
                    c,
                    load_mode,
                    prompt,
                    None if c.budget is None else plain_ref,
                    load_round=r,
                )
            except Exception as e:  # noqa: BLE001 - keep the other loads
                sink.write(
                    "error",
                    config=c.key,
                    category=c.category,
                    load_round=r,
                    error=f"{type(e).__name__}: {e}"[:2000],
                    log_tail=getattr(e, "log_tail", "")[-4000:],
                )
                if c.budget is None:
                    return 6
                continue
            if c.budget is None:
                plain_ref = {int(k): v["tok_s"]["median"] for k, v in rec["by_n_predict"].items()}
            est = max(est, (time.monotonic() - t_start) * 1.2)
    return 0


def measure_overhead(args, sink: Sink, engine, pair, load_mode: str) -> None:
    """dspark's client vs a bare HTTP client on the plain server (issue 8 asks for >= 0.99x)."""
    from dsparkcli.llama.server import LlamaServer
    from study import overhead  # the server side: see the imports at the top

    try:
        with LlamaServer(
            engine, _server_cfg(args, pair, Config("plain", None, None), load_mode), log_dir=args.log_dir
        ) as srv:
            res = overhead.measure(srv.client, "Count from one to one hundred.", reps=3, n_predict=min(args.n_predict))
        sink.write(
            "overhead",
            decode_ratio=res.decode_ratio,
            ttft_delta_s=res.ttft_delta_s,
            bare_decode_tok_s=list(res.bare_decode_tok_s),
            dspark_decode_tok_s=list(res.dspark_decode_tok_s),
            reps=res.reps,
            n_predict=res.n_predict,
        )
    except Exception as e:  # noqa: BLE001 - optional extra: record why, keep the sweep's data
        sink.write("overhead", error=f"{type(e).__name__}: {e}"[:1000])


if __name__ == "__main__":
    sys.exit(main())
