"""Issue 19: where a step's milliseconds go. For plain decoding and each budget k, two servers in turn:

1. ``timing``: llama-server alone: a warm-up request, then one greedy request of --n-predict tokens; its
   timings (prompt/eval ms, draft_n, accepted) and the /metrics drafts counter (= verification steps).
2. ``kernels`` (unless --no-ncu): the same server under Nsight Compute (``ncu --launch-skip S
   --launch-count M``: a bounded window of kernels, well inside a long generation), the per-kernel GPU time
   parsed by study.kernel_profile. ncu serialises the GPU, so only the kernel times of that run are used.

Records (JSONL, one per line, to --out): ``timing``, ``kernels`` and ``error``. The lease plan
study/plans/profile.toml drives this on the H200; study/profile_to_md.py renders the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparkcli.llama import protocol
from dsparkcli.llama.engine import describe, resolve_engine
from dsparkcli.llama.server import LlamaServer, ServerConfig
from study import kernel_profile as profile
from study.gpu_sweep import _stats as draft_stats  # the server log's draft-dspark statistics

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # token ids: every pair here (stand-in, known-answer, real) accepts them


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc: ncu starts the server as its child)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        frontier += kids
    return out


@dataclass
class NcuServer(LlamaServer):
    """llama-server started by ncu. Stopping it stops the SERVER first so that ncu writes its report, then
    waits for ncu; only a stuck ncu gets LlamaServer's SIGTERM/SIGKILL."""

    ncu_argv: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        return [*self.ncu_argv, *self.config.argv(self.engine.server, self.port)]

    def stop(self) -> int | None:
        if self.process is not None and self.process.poll() is None:
            for pid in _descendants(self.process.pid):
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip().startswith("llama-server"):
                        os.kill(pid, signal.SIGTERM)
                except OSError:
                    continue
            try:
                self.process.wait(timeout=300)  # ncu prints the report after its target exits
            except Exception:  # noqa: BLE001 - a stuck ncu: LlamaServer's stop kills it
                pass
        return super().stop()


def ncu_argv(ncu: str, skip: int, count: int, csv_path: Path) -> tuple[str, ...]:
    """One metric (one pass, no replay of the kernel), warm caches and the GPU's own clocks: the times
    are those of the launch as the server would run it, not a cold-cache base-clock figure."""
    return (
        ncu,
        "--target-processes",
        "all",
        "--metrics",
        profile.TIME_METRIC,
        "--csv",
        "--print-units",
        "base",
        "--cache-control",
        "none",
        "--clock-control",
        "none",
        "--launch-skip",
        str(skip),
        "--launch-count",
        str(count),
        "--log-file",
        str(csv_path),
    )


def synth_len(args: argparse.Namespace, budget: int | None) -> float | None:
    """The emulated acceptance length of budget k: --synth-len, at most k + 1 (llama.cpp refuses more)."""
    return min(args.synth_len, budget + 1.0) if budget and args.synth_len else None


def _config(args: argparse.Namespace, budget: int | None, *, stats: bool = False) -> ServerConfig:
    # -lv 4 prints the draft's statistics (its time per call) after each request, as study/gpu_sweep.py's
    # step-cost cells did; only in the timing runs (the profiled one needs no log)
    lv = ("-lv", "4") if stats and budget else ()
    return ServerConfig(
        model=args.target,
        draft=args.draft if budget else None,
        n_max=budget,
        synth_len=synth_len(args, budget),
        ctx=args.ctx,
        threads=args.threads,
        extra_args=(*lv, *args.server_args),
    )


def _payload(n_predict: int) -> dict[str, Any]:
    return protocol.completion_payload(PROMPT, n_predict=n_predict, seed=1, ignore_eos=True, return_tokens=False)


def timing_run(args: argparse.Namespace, engine: Any, name: str, budget: int | None) -> list[dict[str, Any]]:
    """--reps timed requests on one server (no profiler), one record each; with a draft, the draft's own
    time per call from the server log's draft-dspark statistics moved by that request."""
    recs = []
    with LlamaServer(engine, _config(args, budget, stats=True), log_dir=args.log_dir) as srv:
        srv.client.completion(_payload(16))  # warm-up: graphs, allocations; not timed
        wait = 3.0 if budget else 0.0
        n_stats, last = draft_stats(srv.log_path, 0, wait_s=wait)
        for rep in range(args.reps):
            m0 = protocol.SpecCounters.from_metrics(srv.client.metrics())
            resp = srv.client.completion(_payload(args.n_predict))
            moved = protocol.SpecCounters.from_metrics(srv.client.metrics()).minus(m0)
            rec = {
                "record": "timing",
                "config": name,
                "budget": budget,
                "synth_len": synth_len(args, budget),
                "synthetic": synth_len(args, budget) is not None,
                "n_predict": args.n_predict,
                "rep": rep,
                **profile.server_step(resp["timings"], moved.steps),
                "metrics_drafted": moved.drafted,
                "metrics_accepted": moved.accepted,
                "t_draft_ms": None,
            }
            if budget:
                n_new, now = draft_stats(srv.log_path, n_stats, wait_s=wait if n_stats else 0.0)
                if now is not None and last is not None and n_new > n_stats and now[1] > last[1]:
                    rec["draft_calls"] = int(now[1] - last[1])
                    rec["t_draft_ms"] = (now[4] - last[4]) / rec["draft_calls"]
                n_stats, last = n_new, now
            recs.append(rec)
        srv.check_alive()
        argv = srv.argv
    return [{**r, "server_argv": argv[1:]} for r in recs]


def kernel_run(args: argparse.Namespace, engine: Any, name: str, budget: int | None) -> list[dict[str, Any]]:
    csv_path = (args.csv_dir or args.out.parent) / f"ncu-{name}.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    srv = NcuServer(
        engine,
        _config(args, budget),
        log_dir=args.log_dir,
        startup_timeout=600,
        ncu_argv=ncu_argv(args.ncu, args.skip, args.count, csv_path),
    )
    with srv:
        srv.client.completion(_payload(args.ncu_n_predict))
    text = csv_path.read_text(errors="replace") if csv_path.is_file() else ""
    try:
        kernels = profile.parse_ncu_csv(text)
    except ValueError as e:  # ncu's own complaint (==ERROR== ..., e.g. no permission for the counters) is the news
        said = " | ".join([ln for ln in text.splitlines() if ln.startswith("==")][-3:]) or srv.log_tail(5)
        raise RuntimeError(f"{e}; ncu said: {said}") from None
    prof = profile.step_profile(kernels)
    return [
        {
            "record": "kernels",
            "config": name,
            "budget": budget,
            "synth_len": synth_len(args, budget),
            "launch_skip": args.skip,
            "launch_count": args.count,
            "n_predict": args.ncu_n_predict,
            "period": prof.period,
            "steps_in_window": prof.steps,
            "wall_s": round(time.monotonic() - t0, 1),
            **profile.kernels_record(kernels),
        }
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--budgets", type=int, nargs="+", default=[1, 3, 7, 10, 15])
    ap.add_argument(
        "--synth-len", type=float, default=None, help="SYNTHETIC acceptance (--spec-synth-len), at most k+1 per budget"
    )
    ap.add_argument("--n-predict", type=int, default=256, help="tokens of each timed request")
    ap.add_argument("--reps", type=int, default=3, help="timed requests per configuration")
    ap.add_argument("--ncu-n-predict", type=int, default=160, help="tokens of the request under ncu")
    ap.add_argument("--skip", type=int, default=20000, help="ncu --launch-skip (kernels before the window)")
    ap.add_argument("--count", type=int, default=8000, help="ncu --launch-count (kernels in the window)")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--no-ncu", action="store_true", help="server timings only (the CPU smoke)")
    ap.add_argument(
        "--no-plain",
        action="store_true",
        help="budgets only (a later call adding budgets to a label whose plain is measured)",
    )
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log-dir", type=Path, default=None)
    ap.add_argument("--csv-dir", type=Path, default=None, help="where ncu's raw CSVs go (default: beside --out)")
    ap.add_argument("server_args", nargs="*", help="after --: llama-server arguments (-ngl 99 -ngld 99 -fa on)")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    engine = describe(resolve_engine())
    configs: list[tuple[str, int | None]] = ([] if args.no_plain else [("plain", None)]) + [
        (f"k{k}", k) for k in args.budgets
    ]
    failed = 0
    with open(args.out, "a") as sink:

        def write(rec: dict[str, Any]) -> None:
            sink.write(json.dumps({**rec, "engine": {"commit": engine.commit, "backend": engine.backend}}) + "\n")
            sink.flush()

        for name, budget in configs:
            runs = [timing_run] if args.no_ncu else [timing_run, kernel_run]
            for run in runs:
                t0 = time.monotonic()
                try:
                    recs = run(args, engine, name, budget)
                except Exception as e:  # noqa: BLE001 - one configuration's failure is a record, not the end
                    failed += 1
                    write(
                        {
                            "record": "error",
                            "config": name,
                            "phase": run.__name__,
                            "error": f"{type(e).__name__}: {e}"[:500],
                        }
                    )
                    print(f"{name} {run.__name__}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                    continue
                for rec in recs:
                    write(rec)
                rec = profile.median_timing(recs) if recs[0]["record"] == "timing" else recs[0]
                extra = (
                    f"t_step {rec['t_step_ms']:.3f} ms, {rec['tokens_per_step']:.2f} tok/step"
                    if rec["record"] == "timing"
                    else f"{len(rec['kernels'])} kernels, period {rec['period']}"
                )
                print(f"{name} {run.__name__}: {extra} ({time.monotonic() - t0:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
