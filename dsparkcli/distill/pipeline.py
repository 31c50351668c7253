"""`dspark distill TARGET OUT`: every stage, resumable from a work folder, ending in one atomic GGUF.

Work folder layout (default: ``<cache>/distill/<target sha256[:12]>``)::

    prompts.json    stage 1: corpus as token ids (needs llama-server with the target, any backend)
    questions.json  stage 2: the target's own questions
    data.npz        stage 3: greedy responses (the training set)
    ckpt.pt         training checkpoint (resumed when the draft shape is the same)
    report.json     what was done and measured, also written into the GGUF's metadata
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import torch

from dsparkcli import __version__
from dsparkcli.bench.prompts import load_prompts
from dsparkcli.distill import corpus, data, export, train
from dsparkcli.distill.data import Dataset, PromptIds
from dsparkcli.distill.target import check_arch, load_target
from dsparkcli.distill.train import EOG_TEXTS, TrainOptions
from dsparkcli.errors import UsageError
from dsparkcli.gguf.reader import read_header
from dsparkcli.hub.download import hash_file
from dsparkcli.llama.server import LlamaServer, ServerConfig

Progress = Callable[[str, int, int, dict[str, Any]], None]


@dataclass(frozen=True)
class DistillPlan:
    target: Path
    out: Path
    work: Path
    train: TrainOptions
    n_prompts: int = 6000
    n_meta: int = 3000
    max_new: int = 384
    question_tokens: int = 48
    gen_batch: int = 256
    data_minutes: float | None = None  # stop generating responses after this long (keep what is done)
    device: str = "auto"
    outtype: str = "q8_0"
    prompts_file: Path | None = None
    threads: int | None = None
    # stage 1 only (it needs a llama-server for the chat template): prepare the work folder on a machine
    # with an engine, train where the GPU is (a machine whose engine is still building, for one)
    prepare_only: bool = False


@dataclass
class DistillReport:
    out: str
    target_sha256: str
    device: str
    stages: dict[str, float] = field(default_factory=dict)  # stage -> seconds (this invocation)
    data: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    out_sha256: str | None = None
    out_bytes: int | None = None


def _eval_texts() -> list[str]:
    """The bench kit's prompts: held out of training."""
    return [p.text for p in load_prompts(None)]


def _stop_and_newline(tok) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    stop = sorted(
        {tok.special[k] for k in ("eos", "eot", "eom") if k in tok.special}
        | {i for i, t in enumerate(tok.tokens) if t in EOG_TEXTS}
    )
    newline = [i for i, t in enumerate(tok.tokens) if "\n" in t or "Ċ" in t]  # Ċ: byte-level BPE's "\n"
    return stop, newline


def stage_prompts(plan: DistillPlan, tok, engine, progress: Progress | None) -> dict:  # type: ignore[no-untyped-def]
    """Stage 1 (see module doc). Starts a CPU llama-server with the target for its template and tokenizer."""
    prompts = corpus.templated(plan.n_prompts, plan.train.seed)
    if plan.prompts_file is not None:
        prompts = corpus.load_user_prompts(plan.prompts_file) + prompts
    evals = _eval_texts()
    kept = corpus.held_out(prompts, evals)
    meta = corpus.meta_prompts(plan.n_meta, plan.train.seed)
    stop, newline = _stop_and_newline(tok)
    cfg = ServerConfig(
        model=plan.target,
        draft=None,
        mmproj=None,
        n_max=None,
        p_min=None,
        ctx=4096,
        threads=plan.threads,
        synth_len=None,
        extra_args=("-ngl", "0"),
    )
    bos = tok.special.get("bos") if _add_bos(plan.target) else None
    with LlamaServer(engine, cfg) as srv:
        pids = data.tokenize_prompts(
            srv.client, kept, meta, stop, newline, bos, (lambda s, d, t: progress(s, d, t, {})) if progress else None
        )
    obj = pids.to_json() | {"dropped_as_eval": len(prompts) - len(kept)}
    data.write_json(plan.work / "prompts.json", obj)
    return obj


def _add_bos(path: Path) -> bool:
    f = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(f.contents()) if f is not None else False


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device here (use --device cpu)")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda[:N], got {name!r}")
    return name


def run_distill(
    plan: DistillPlan,
    engine: Callable[[], Any],
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> DistillReport:
    """``engine`` is called only when stage 1 has to run (a work folder that has prompts.json needs none)."""
    if plan.outtype not in export.OUT_TYPES:
        raise UsageError(f"--outtype must be one of {', '.join(export.OUT_TYPES)}")
    # dspark's bounded header reader first, before the work folder, the sha256 or gguf-py's reader (whose
    # text file, empty file or truncated GGUF are a traceback): a GGUFError is one line, nothing written
    check_arch(read_header(plan.target).arch)
    plan.work.mkdir(parents=True, exist_ok=True)
    dev = pick_device(plan.device)
    report = DistillReport(out=str(plan.out), target_sha256=hash_file(plan.target), device=dev)
    if dev.startswith("cuda"):
        report.device = f"{dev} ({torch.cuda.get_device_name(torch.device(dev))})"
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.monotonic()
    target, tok = load_target(plan.target)
    target.to(dev)
    report.stages["load_target"] = round(time.monotonic() - t0, 2)

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t = time.monotonic()
        value = fn()
        report.stages[name] = round(time.monotonic() - t, 2)
        return value

    def gen_progress(stage: str, done: int, total: int) -> None:
        if progress:
            progress(stage, done, total, {})

    p_path = plan.work / "prompts.json"
    pj = (
        json.loads(p_path.read_text())
        if p_path.exists()
        else timed("prompts", lambda: stage_prompts(plan, tok, engine(), progress))
    )
    pids = PromptIds.from_json({k: v for k, v in pj.items() if k != "dropped_as_eval"})
    if plan.prepare_only:
        report.data = {
            "prompts": len(pids.ids),
            "meta_prompts": len(pids.meta_ids),
            "dropped_as_eval": pj.get("dropped_as_eval", 0),
            "work": str(plan.work),
        }
        return report
    q_path = plan.work / "questions.json"
    if q_path.exists():
        questions = json.loads(q_path.read_text())
    else:
        questions = timed(
            "questions",
            lambda: data.write_questions(
                target, pids, plan.gen_batch, plan.question_tokens, plan.train.seed, gen_progress
            ),
        )
        data.write_json(q_path, questions)
    d_path = plan.work / "data.npz"
    if d_path.exists():
        ds = Dataset.load(d_path)
    else:
        # self-written questions take the category and group of the meta-prompt that asked for them
        deadline = time.monotonic() + plan.data_minutes * 60 if plan.data_minutes else None
        ds = timed(
            "responses",
            lambda: data.write_responses(
                target,
                pids.ids + [q["ids"] for q in questions],
                pids.categories + [q["category"] for q in questions],
                plan.gen_batch,
                plan.max_new,
                pids.stop,
                gen_progress,
                deadline,
                plan.train.seed,
                pids.groups + [q["group"] for q in questions],
            ),
        )
        ds.save(d_path)
    report.data = {
        "sequences": len(ds),
        "tokens": ds.n_tokens,
        "response_tokens": ds.n_response_tokens,
        "templated_prompts": len(pids.ids),
        "self_written_questions": len(questions),
        "dropped_as_eval": pj.get("dropped_as_eval", 0),
        "max_new": plan.max_new,
    }
    if should_stop and should_stop():
        raise KeyboardInterrupt
    draft, result = timed("train", lambda: train.train(target, tok, ds, plan.train, plan.work, progress, should_stop))
    report.training = result.summary() | {
        "options": train.options_dict(plan.train),
        "losses": result.losses,
        "evals": result.evals,
        "config": result.config.to_dict(),
    }
    prov = {
        "target_sha256": report.target_sha256,
        "dspark_version": __version__,
        "device": report.device,
        "data": report.data,
        "training": result.summary(),
        "losses": result.losses,
    }
    timed("export", lambda: export.write_gguf(plan.out, draft, tok, plan.outtype, prov))
    report.out_sha256 = hash_file(plan.out)
    report.out_bytes = plan.out.stat().st_size
    data.write_json(plan.work / "report.json", report.__dict__)
    return report
