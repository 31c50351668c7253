"""`dspark bench`: plain decoding vs every draft × budget, on one prompt kit, with identity checks.

One llama-server per configuration (this llama.cpp compiled out per-request draft settings), started
before timing and warmed up; every prompt × rep runs greedy through ``/completion`` with
``return_tokens`` so outputs are compared token by token against plain decoding from the same run.
``/metrics`` is read around each (rep, category) block: its counters give verification steps and
per-position acceptance, which the per-response ``timings`` lack.

Everything lands in a JSONL file, one line flushed per event, so Ctrl-C keeps what was measured:

* ``prompt``    once per prompt: the templated text that was sent (images by sha256)
* ``request``   one per config × prompt × rep: timings, output tokens, hashes, identity vs plain
* ``counters``  one per config × rep × category: /metrics deltas (drafted, accepted, steps, per position)
* ``summary``   one per config × category (and category ``all``): the figures the report shows
* ``overhead``  one per run: wall time vs Σ generation time + one load per configuration

Each carries the run's provenance. Summaries are recomputed from the other records by ``summarize``.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import hashlib
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dsparkcli import provenance
from dsparkcli.engine import Engine
from dsparkcli.errors import BenchError, UsageError
from dsparkcli.prompts import Prompt, image_base64
from dsparkcli.server import LlamaServer, ServerClient, ServerConfig

PLAIN = "plain"
ALL = "all"
DEFAULT_BUDGET = 5  # when neither --budget nor the registry pair gives one
# Pinned so the templated prompts rendered on the first server stay valid on every later one
# (llama-server otherwise draws a random marker per process).
MEDIA_MARKER = "<__media__>"
RESPONSE_FIELDS = ["content", "tokens", "timings", "stop_type", "tokens_evaluated", "truncated"]

_M_DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
_M_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
_M_STEPS = "llamacpp:spec_decode_num_drafts_total"
_M_PER_POS = 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="'


@dataclass(frozen=True)
class Draft:
    label: str  # registry key or file stem: names the configuration
    path: Path


@dataclass(frozen=True)
class Arm:
    """One server configuration: plain, or one draft at one budget."""

    name: str
    draft: Draft | None = None
    budget: int | None = None


@dataclass(frozen=True)
class BenchPlan:
    target: Path
    drafts: tuple[Draft, ...]
    budgets: tuple[int, ...]
    prompts: tuple[Prompt, ...]
    mmproj: Path | None = None
    reps: int = 3
    warmup: int = 1
    n_predict: int = 256
    ctx: int | None = 4096
    p_min: float | None = None
    synth_len: float | None = None  # llama.cpp's emulated acceptance: every figure is then synthetic
    ignore_eos: bool = False
    seed: int = 0
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    upstream_acceptance: tuple[tuple[str, float], ...] = ()  # (category, upstream acceptance length)
    model_name: str | None = None

    @property
    def synthetic(self) -> bool:
        return self.synth_len is not None

    def arms(self) -> list[Arm]:
        arms = [Arm(PLAIN)]
        for d in self.drafts:
            arms += [Arm(f"{d.label}@{b}", d, b) for b in self.budgets]
        return arms

    def total_requests(self) -> int:
        return len(self.arms()) * (self.warmup + len(self.prompts) * self.reps)

    def validate(self) -> None:
        if not self.drafts:
            raise UsageError("bench needs at least one draft (--draft or --model)")
        if not self.budgets:
            raise UsageError("bench needs at least one --budget")
        if any(b < 1 for b in self.budgets):
            raise UsageError(f"--budget values must be >= 1 (got {', '.join(map(str, self.budgets))})")
        if len(set(self.budgets)) != len(self.budgets):
            raise UsageError("--budget values must be distinct")
        labels = [d.label for d in self.drafts]
        if len(set(labels)) != len(labels):
            raise UsageError(f"two drafts share the label '{next(lb for lb in labels if labels.count(lb) > 1)}'")
        if self.reps < 1:
            raise UsageError("--reps must be at least 1")
        if self.warmup < 0:
            raise UsageError("--warmup must be >= 0")
        if self.n_predict < 1:
            raise UsageError("--n-predict must be at least 1")
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise UsageError(f"--p-min must be within [0, 1] (got {self.p_min})")
        if self.synth_len is not None:
            worst = min(self.budgets)
            if not 1.0 <= self.synth_len <= worst + 1:
                raise UsageError(f"--synth-len must be within [1, {worst + 1}] for budget {worst} (got {self.synth_len})")
        if not self.prompts:
            raise UsageError("no prompts selected")
        if self.mmproj is None:
            vision = [p.id for p in self.prompts if p.has_images]
            if vision:
                raise UsageError(f"{len(vision)} prompts have images (e.g. {vision[0]}) but no --mmproj was given",
                                 hint="pass --mmproj, or --category text")


@dataclass(frozen=True)
class Overhead:
    wall_s: float  # the whole bench, servers' start and stop included
    generation_s: float  # Σ server-side prompt + generation time of every request (warm-up included)
    load_s: float  # Σ time to healthy, one load per configuration
    request_s: float  # Σ client-side round trips (generation + the server's untimed work + HTTP)
    ratio: float  # wall / (generation + load)
    provenance_s: float = 0.0  # part of wall spent waiting for the file sha256s (hashed alongside the first config)
    stop_s: float = 0.0  # part of wall: Σ server shutdowns

    @property
    def ratio_after_hashing(self) -> float:
        """The ratio without the one-time provenance hashing (what a re-run with a warm hash cache sees)."""
        denom = self.generation_s + self.load_s
        return (self.wall_s - self.provenance_s) / denom if denom > 0 else float("inf")


@dataclass(frozen=True)
class BenchResult:
    run_id: str
    out: Path
    summaries: tuple[dict[str, Any], ...]
    overhead: Overhead
    synthetic: bool


@dataclass(frozen=True)
class BenchInputs:
    """The files a bench runs on, and what the registry says about them."""

    target: Path
    mmproj: Path | None
    drafts: tuple[Draft, ...]
    upstream_acceptance: tuple[tuple[str, float], ...] = ()
    budget: int | None = None  # the registry pair's default budget
    model_name: str | None = None


def _split_label(spec: str) -> tuple[str | None, str]:
    """``LABEL=PATH`` names a draft in tables; a bare path or registry key has no label."""
    label, sep, rest = spec.partition("=")
    if sep and label and rest and "/" not in label and not label.startswith("hf:"):
        return label, rest
    return None, spec


def _label(path: str, taken: set[str]) -> str:
    stem = Path(path).name.removesuffix(".gguf") or "draft"
    label, n = stem, 2
    while label in taken:
        label, n = f"{stem}-{n}", n + 1
    return label


def resolve_inputs(*, model: str | None, target: str | None, drafts: Sequence[str], mmproj: str | None,
                   yes: bool = False) -> BenchInputs:
    """Local paths (or hf:// refs) with --target, else the registry pair (``drafts``: keys or paths,
    each optionally ``LABEL=...`` to name its configurations).

    Every draft is checked against the target first: a wrong pair fails in one line, not as a
    llama.cpp assert in each configuration.
    """
    from dsparkcli import runner

    resolved: list[Draft] = []
    taken: set[str] = set()
    if target is not None:
        if model is not None:
            raise UsageError("give either --model or --target, not both")
        if not drafts:
            raise UsageError("--target needs at least one --draft")
        for spec in drafts:
            given, d = _split_label(spec)
            files = runner.resolve_files(target=target, draft=d, mmproj=mmproj, yes=yes)
            runner.check_pairing(files)
            label = given or _label(d, taken)
            taken.add(label)
            resolved.append(Draft(label, files.draft))  # type: ignore[arg-type]
        return BenchInputs(target=files.target, mmproj=files.mmproj, drafts=tuple(resolved))
    from dsparkcli import registry

    reg = registry.load_registry()
    name = model or reg.default
    if name is None:
        raise UsageError("no --model given and the registry has no default pair; pass --target and --draft")
    pair = reg.get(name)
    for spec in drafts or [pair.default_draft]:
        given, d = _split_label(spec)
        if d in pair.drafts:
            files = runner.resolve_files(model=name, draft_key=d, mmproj=mmproj, yes=yes)
            label = given or d
        else:
            files = runner.resolve_files(model=name, draft=d, mmproj=mmproj, yes=yes)
            label = given or _label(d, taken)
        if files.draft is None:
            raise UsageError(f"pair {name} has no draft '{d}' (known: {', '.join(pair.drafts)})")
        runner.check_pairing(files)
        taken.add(label)
        resolved.append(Draft(label, files.draft))
    return BenchInputs(target=files.target, mmproj=files.mmproj, drafts=tuple(resolved),
                       upstream_acceptance=tuple(pair.acceptance.items()), budget=pair.budget, model_name=name)


# ------------------------------------------------------------------ statistics (pure)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Median, min and max; None for an empty sequence."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def speedup(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def mean_length(accepted: int, steps: int) -> float | None:
    """Mean acceptance length, vLLM's definition: 1 + accepted / verification steps."""
    return 1.0 + accepted / steps if steps else None


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where ``other`` leaves ``reference``; None when identical.

    When one stream is a prefix of the other, the divergence is where the shorter one ends.
    """
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    if len(reference) != len(other):
        return min(len(reference), len(other))
    return None


def tokens_sha256(tokens: Sequence[int]) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in tokens).encode()).hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_counters(metrics: dict[str, float]) -> dict[str, Any]:
    """The speculative counters out of parsed /metrics (missing ones read as 0)."""
    per_pos: dict[int, int] = {}
    for key, value in metrics.items():
        if key.startswith(_M_PER_POS):
            per_pos[int(key[len(_M_PER_POS):].split('"', 1)[0])] = int(value)
    width = max(per_pos) + 1 if per_pos else 0
    return {"drafted": int(metrics.get(_M_DRAFTED, 0)), "accepted": int(metrics.get(_M_ACCEPTED, 0)),
            "steps": int(metrics.get(_M_STEPS, 0)), "accepted_per_pos": [per_pos.get(i, 0) for i in range(width)]}


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    width = max(len(before["accepted_per_pos"]), len(after["accepted_per_pos"]))
    pad = lambda xs: list(xs) + [0] * (width - len(xs))  # noqa: E731 - the per-position list grows when first used
    return {"drafted": after["drafted"] - before["drafted"], "accepted": after["accepted"] - before["accepted"],
            "steps": after["steps"] - before["steps"],
            "accepted_per_pos": [a - b for a, b in zip(pad(after["accepted_per_pos"]), pad(before["accepted_per_pos"]))]}


def _sum_counters(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"drafted": 0, "accepted": 0, "steps": 0, "accepted_per_pos": []}
    for c in items:
        total["drafted"] += c["drafted"]
        total["accepted"] += c["accepted"]
        total["steps"] += c["steps"]
        pp = total["accepted_per_pos"]
        for i, v in enumerate(c["accepted_per_pos"]):
            if i < len(pp):
                pp[i] += v
            else:
                pp.append(v)
    return total


def _rep_tok_s(requests: Sequence[dict[str, Any]]) -> list[float]:
    """Per rep: Σ tokens / Σ generation time over the group's prompts (one "run" of the kit per rep)."""
    by_rep: dict[int, list[dict[str, Any]]] = {}
    for r in requests:
        by_rep.setdefault(r["rep"], []).append(r)
    values = []
    for rep in sorted(by_rep):
        n = sum(r["n_predicted"] for r in by_rep[rep])
        ms = sum(r["predicted_ms"] for r in by_rep[rep])
        if ms > 0:
            values.append(1000.0 * n / ms)
    return values


def _identity(requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt: identical when every rep matched plain; the earliest divergence over reps otherwise."""
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    divergent = []
    for pid, reqs in by_prompt.items():
        firsts = [r["first_divergence"] for r in reqs if r.get("first_divergence") is not None]
        if firsts or any(r.get("identical_to_plain") is False for r in reqs):
            worst = min(reqs, key=lambda r: r["first_divergence"] if r.get("first_divergence") is not None else 1 << 30)
            divergent.append({"prompt_id": pid, "first_divergence": min(firsts) if firsts else None,
                              "output_sha256": worst["output_sha256"], "plain_sha256": worst.get("plain_sha256")})
    n = len(by_prompt)
    return {"identical": n - len(divergent), "prompts": n,
            "identical_pct": 100.0 * (n - len(divergent)) / n if n else None, "divergent": divergent}


def summarize(records: Iterable[dict[str, Any]], upstream: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Summary rows per configuration × category (and ``all``) from request and counters records.

    Pure: the same JSONL always gives the same table. Speedup is the ratio of median tok/s to plain's
    median tok/s for the same category in the same run.
    """
    upstream = upstream or {}
    requests: list[dict[str, Any]] = []
    counters: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("record") == "request":
            requests.append(rec)
        elif rec.get("record") == "counters":
            counters.append(rec)
    configs: list[str] = []
    categories: list[str] = []
    for r in requests:
        if r["config"] not in configs:
            configs.append(r["config"])
        if r["category"] not in categories:
            categories.append(r["category"])
    plain_median: dict[str, float | None] = {}
    rows: list[dict[str, Any]] = []
    for config in configs:
        reqs_c = [r for r in requests if r["config"] == config]
        first = reqs_c[0]
        for category in categories + [ALL]:
            reqs = reqs_c if category == ALL else [r for r in reqs_c if r["category"] == category]
            if not reqs:
                continue
            tok_s = spread(_rep_tok_s(reqs))
            if config == PLAIN:
                plain_median[category] = tok_s["median"]
            row: dict[str, Any] = {
                "record": "summary", "config": config, "draft": first.get("draft"), "budget": first.get("budget"),
                "category": category, "synthetic": bool(first.get("synthetic")),
                "synth_len": first.get("synth_len"),
                "prompts": len({r["prompt_id"] for r in reqs}), "reps": len({r["rep"] for r in reqs}),
                "requests": len(reqs), "tokens": sum(r["n_predicted"] for r in reqs),
                "tok_s": tok_s, "speedup": speedup(tok_s["median"], plain_median.get(category)),
                "upstream_acceptance_length": upstream.get(category) if category != ALL else None,
            }
            if config != PLAIN:
                cs = [c for c in counters if c["config"] == config and (category == ALL or c["category"] == category)]
                tot = _sum_counters(cs)
                row.update({
                    "drafted": tot["drafted"], "accepted": tot["accepted"], "steps": tot["steps"],
                    "acceptance_rate": tot["accepted"] / tot["drafted"] if tot["drafted"] else None,
                    "mean_length": mean_length(tot["accepted"], tot["steps"]),
                    "accepted_per_pos": tot["accepted_per_pos"],
                    "acceptance_per_pos": [v / tot["steps"] for v in tot["accepted_per_pos"]] if tot["steps"] else [],
                    "timings_drafted": sum(r.get("draft_n", 0) for r in reqs),
                    "timings_accepted": sum(r.get("draft_n_accepted", 0) for r in reqs),
                    **_identity(reqs),
                })
            rows.append(row)
    return rows


def read_jsonl(path: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Records of one run (the last one in the file when ``run_id`` is None)."""
    records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if run_id is None and records:
        run_id = records[-1].get("run_id")
    return [r for r in records if r.get("run_id") == run_id]


# ------------------------------------------------------------------ the run


def render_prompts(client: ServerClient, prompts: Sequence[Prompt]) -> dict[str, str]:
    """Each prompt through the target's chat template, with pinned media markers."""
    rendered = {}
    for p in prompts:
        # thinking off, as in the upstream acceptance measurements; templates without the switch ignore it
        rendered[p.id] = client.apply_template(p.messages(), chat_template_kwargs={"enable_thinking": False})
    return rendered


def _payload(plan: BenchPlan, prompt: Prompt, rendered: str, images_b64: list[str]) -> dict[str, Any]:
    text: Any = {"prompt_string": rendered, "multimodal_data": images_b64} if images_b64 else rendered
    return {"prompt": text, "n_predict": plan.n_predict, "temperature": 0.0, "seed": plan.seed,
            "return_tokens": True, "cache_prompt": False, "ignore_eos": plan.ignore_eos,
            "response_fields": RESPONSE_FIELDS}


class _Writer:
    """Appends one JSON line per record and flushes it: an interrupted bench keeps every finished line.

    The provenance block (file sha256s: ~20 s for a 20 GB target the first time) is computed in a thread
    while the first configuration loads and runs; records wait in ``pending`` until it is ready, and
    ``flush(wait=True)`` (end of run, or interruption) writes them all with it.
    """

    def __init__(self, fh: TextIO, run_id: str, provenance_block: concurrent.futures.Future[dict[str, Any]]) -> None:
        self.fh, self.run_id, self.provenance = fh, run_id, provenance_block
        self.records: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.waited_s = 0.0  # time the bench sat waiting for the hashes (counts as overhead)

    def write(self, rec: dict[str, Any]) -> dict[str, Any]:
        full = {**rec, "run_id": self.run_id}
        self.records.append(full)
        self.pending.append(full)
        self.flush()
        return full

    def flush(self, *, wait: bool = False) -> None:
        if not self.pending or not (wait or self.provenance.done()):
            return
        t0 = time.perf_counter()
        block = self.provenance.result()
        self.waited_s += time.perf_counter() - t0
        for rec in self.pending:
            rec["provenance"] = block
            self.fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.fh.flush()
        self.pending.clear()


def default_out_path(run_id: str) -> Path:
    from dsparkcli import config

    return config.cache_dir() / "bench" / f"bench-{run_id}.jsonl"


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


@dataclass
class _Totals:
    """Running sums for the overhead record."""

    generation_s: float = 0.0  # server-side prompt + generation time (timings)
    request_s: float = 0.0  # client-side round trips of the same requests
    load_s: float = 0.0  # time to healthy, per configuration
    stop_s: float = 0.0  # server shutdown (freeing a large model's memory is not free)


@dataclass
class _RunState:
    """What later configurations need from earlier ones: plain outputs and the rendered prompts."""

    rendered: dict[str, str] | None = None
    plain_tokens: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    plain_sha: dict[tuple[str, int], str] = field(default_factory=dict)


def _timed_completion(client: ServerClient, payload: dict[str, Any], totals: _Totals) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    resp = client.completion(payload)
    request_ms = 1000.0 * (time.perf_counter() - t0)
    t = resp.get("timings") or {}
    totals.request_s += request_ms / 1000.0
    totals.generation_s += (t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0)) / 1000.0
    return resp, request_ms


def _request_record(plan: BenchPlan, arm: Arm, p: Prompt, rep: int, resp: dict[str, Any], request_ms: float,
                    server_argv: list[str], state: _RunState) -> dict[str, Any]:
    t = resp.get("timings") or {}
    tokens = [int(x) for x in resp.get("tokens") or []]
    rec: dict[str, Any] = {
        "record": "request", "config": arm.name, "draft": arm.draft.label if arm.draft else None,
        "budget": arm.budget, "synthetic": plan.synthetic, "synth_len": plan.synth_len if arm.draft else None,
        "category": p.category, "prompt_id": p.id, "rep": rep,
        "prompt_n": int(resp.get("tokens_evaluated", t.get("prompt_n", 0))), "prompt_ms": t.get("prompt_ms"),
        "n_predicted": int(t.get("predicted_n", len(tokens))), "predicted_ms": float(t.get("predicted_ms", 0.0)),
        "tok_s": t.get("predicted_per_second"), "request_ms": request_ms,
        "draft_n": int(t.get("draft_n", 0)), "draft_n_accepted": int(t.get("draft_n_accepted", 0)),  # absent: 0
        "stop_type": resp.get("stop_type"), "truncated": resp.get("truncated"),
        "tokens": tokens, "tokens_sha256": tokens_sha256(tokens),
        "output_sha256": text_sha256(str(resp.get("content", ""))), "server_argv": server_argv,
    }
    key = (p.id, rep)
    if arm.draft is None:
        state.plain_tokens[key] = tokens
        state.plain_sha[key] = rec["output_sha256"]
    else:
        div = first_divergence(state.plain_tokens[key], tokens)
        rec.update({"identical_to_plain": div is None, "first_divergence": div, "plain_sha256": state.plain_sha[key]})
    return rec


def _run_arm(engine: Engine, plan: BenchPlan, arm: Arm, writer: _Writer, state: _RunState, totals: _Totals,
             images_b64: dict[str, list[str]], image_sha: dict[str, list[str]], categories: list[str],
             on_request: Callable[[str, str], None] | None) -> float:
    """One configuration: start its server, warm up, run every rep × category × prompt. Returns load seconds."""
    is_draft = arm.draft is not None
    cfg = ServerConfig(
        model=plan.target, draft=arm.draft.path if arm.draft else None, mmproj=plan.mmproj, n_max=arm.budget,
        p_min=plan.p_min if is_draft else None, synth_len=plan.synth_len if is_draft else None, ctx=plan.ctx,
        threads=plan.threads, extra_args=plan.extra_args,
    )
    srv = LlamaServer(engine, cfg, env={"LLAMA_MEDIA_MARKER": MEDIA_MARKER})
    t_load0 = time.perf_counter()
    with srv:
        load_s = time.perf_counter() - t_load0
        totals.load_s += load_s
        client = srv.client
        assert client is not None
        server_argv = srv.argv
        if state.rendered is None:  # same target, same template: render once, on the first server
            state.rendered = render_prompts(client, plan.prompts)
            for p in plan.prompts:
                writer.write({"record": "prompt", "prompt_id": p.id, "category": p.category,
                              "rendered": state.rendered[p.id], "images_sha256": image_sha[p.id],
                              "media_marker": MEDIA_MARKER})
        rendered = state.rendered

        def request(p: Prompt) -> tuple[dict[str, Any], float]:
            result = _timed_completion(client, _payload(plan, p, rendered[p.id], images_b64[p.id]), totals)
            if on_request:
                on_request(arm.name, p.id)
            return result

        for i in range(plan.warmup):  # untimed: first-use allocations, caches, page-ins
            request(plan.prompts[i % len(plan.prompts)])

        drafted = 0
        # counters only move while a request runs, so each block's "after" is the next one's "before"
        before = parse_counters(client.metrics()) if is_draft else None
        for rep in range(plan.reps):
            for category in categories:
                for p in (q for q in plan.prompts if q.category == category):
                    resp, request_ms = request(p)
                    writer.write(_request_record(plan, arm, p, rep, resp, request_ms, server_argv, state))
                if before is not None:
                    after = parse_counters(client.metrics())
                    delta = counters_delta(before, after)
                    before = after
                    drafted += delta["drafted"]
                    writer.write({"record": "counters", "config": arm.name, "draft": arm.draft.label,  # type: ignore[union-attr]
                                  "budget": arm.budget, "category": category, "rep": rep, **delta,
                                  "synthetic": plan.synthetic, "server_argv": server_argv})
            if is_draft and drafted == 0:  # a whole pass without one draft: fail now, not in an hour
                raise BenchError(
                    f"configuration {arm.name} drafted nothing in {len(plan.prompts) * (rep + 1)} requests "
                    f"(check that the draft fits the target, --p-min, --spec-draft-n-min)",
                    hint=f"server log: {srv.log_path}")
        t_stop0 = time.perf_counter()
    totals.stop_s += time.perf_counter() - t_stop0
    return load_s


def run_bench(engine: Engine, plan: BenchPlan, *, out: Path | None = None, run_id: str | None = None,
              argv: list[str] | None = None, on_request: Callable[[str, str], None] | None = None) -> BenchResult:
    """Run every configuration of ``plan``; append records to ``out`` (JSONL) as they are measured.

    ``on_request(config, prompt_id)`` is called after each request (warm-up included), for progress.
    Raises BenchError when a draft configuration drafts nothing over a whole pass of the prompts.
    """
    t_wall0 = time.perf_counter()
    plan.validate()
    run_id = run_id or new_run_id()
    out = Path(out) if out is not None else default_out_path(run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path | None] = {"target": plan.target, "mmproj": plan.mmproj}
    files.update({f"draft:{d.label}": d.path for d in plan.drafts})
    hashing = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dspark-provenance")
    prov = hashing.submit(provenance.collect, engine, files, argv=argv, reps=plan.reps, extra={
        "run_id": run_id, "model": plan.model_name, "n_predict": plan.n_predict, "warmup": plan.warmup,
        "seed": plan.seed, "ignore_eos": plan.ignore_eos, "p_min": plan.p_min, "synth_len": plan.synth_len,
        "synthetic": plan.synthetic, "ctx": plan.ctx,
    })
    hashing.shutdown(wait=False)
    images_b64 = {p.id: [image_base64(i) for i in p.images] for p in plan.prompts}
    image_sha = {p.id: [provenance.file_facts(i).sha256 for i in p.images] for p in plan.prompts}
    categories = list(dict.fromkeys(p.category for p in plan.prompts))  # kit order
    upstream = dict(plan.upstream_acceptance)
    totals, state = _Totals(), _RunState()
    with open(out, "a", encoding="utf-8") as fh:
        writer = _Writer(fh, run_id, prov)
        try:
            for arm in plan.arms():
                load_s = _run_arm(engine, plan, arm, writer, state, totals, images_b64, image_sha, categories,
                                  on_request)
                for row in summarize(writer.records, upstream):
                    if row["config"] == arm.name:
                        if row["category"] == ALL:
                            row["load_s"] = load_s
                        writer.write(row)
        finally:
            writer.flush(wait=True)  # whatever happened, every measured line reaches the file, with provenance
        wall_s = time.perf_counter() - t_wall0
        denom = totals.generation_s + totals.load_s
        provenance_s = writer.waited_s
        overhead = Overhead(wall_s=wall_s, generation_s=totals.generation_s, load_s=totals.load_s,
                            request_s=totals.request_s, ratio=wall_s / denom if denom > 0 else float("inf"),
                            provenance_s=provenance_s, stop_s=totals.stop_s)
        writer.write({"record": "overhead", "wall_s": wall_s, "generation_s": totals.generation_s,
                      "load_s": totals.load_s, "request_s": totals.request_s, "provenance_s": provenance_s,
                      "stop_s": totals.stop_s, "ratio": overhead.ratio,
                      "ratio_after_hashing": overhead.ratio_after_hashing,
                      "configurations": len(plan.arms()), "requests": plan.total_requests(),
                      "synthetic": plan.synthetic})
    summaries = tuple(r for r in writer.records if r["record"] == "summary")
    return BenchResult(run_id=run_id, out=out, summaries=summaries, overhead=overhead, synthetic=plan.synthetic)
