"""The `run` job: from a model name or local files to a streamed answer with acceptance statistics.

Flow: validate images (Pillow) → resolve files (registry + hub, or local paths / hf:// refs) → pairing
check (header only, before anything is launched) → LlamaServer with mmproj + draft (or a running
server) → one streamed /v1/chat/completions request → RunResult with timings and acceptance.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparkcli.engine import Engine
from dsparkcli.errors import PairingError, ServerError, UsageError
from dsparkcli.server import LlamaServer, ServerClient, ServerConfig

Confirm = Callable[[list[Any]], bool]  # shown the planned downloads (hub.PlannedFile), answers go/no-go

IMAGE_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "BMP": "image/bmp", "GIF": "image/gif"}
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 8192 * 8192

# Counters llama-server exposes at /metrics with --metrics (llamacpp_dspark.md §2.2)
M_DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
M_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
M_STEPS = "llamacpp:spec_decode_num_drafts_total"


@dataclass(frozen=True)
class ImageInput:
    path: Path
    format: str
    width: int
    height: int
    data_url: str


@dataclass(frozen=True)
class Acceptance:
    drafted: int
    accepted: int
    steps: int | None  # verification steps (from /metrics); None when the server has no metrics

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_len(self) -> float | None:
        """Tokens per verification step, llama.cpp's definition: 1 + accepted / steps."""
        return 1 + self.accepted / self.steps if self.steps else None


@dataclass(frozen=True)
class RunResult:
    text: str
    n_tokens: int
    prompt_tokens: int
    decode_tok_s: float
    prompt_tok_s: float
    ttft_s: float  # client-side: request sent → first content byte
    wall_s: float  # client-side: request sent → stream closed
    acceptance: Acceptance | None  # None for plain decoding
    finish_reason: str | None
    timings: dict[str, Any]
    budget: int | None
    server_argv: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        acc = self.acceptance
        return {
            "text": self.text,
            "n_tokens": self.n_tokens,
            "prompt_tokens": self.prompt_tokens,
            "decode_tok_s": self.decode_tok_s,
            "prompt_tok_s": self.prompt_tok_s,
            "ttft_s": self.ttft_s,
            "wall_s": self.wall_s,
            "budget": self.budget,
            "drafted": acc.drafted if acc else None,
            "accepted": acc.accepted if acc else None,
            "steps": acc.steps if acc else None,
            "acceptance_rate": acc.rate if acc else None,
            "mean_acceptance_length": acc.mean_len if acc else None,
            "finish_reason": self.finish_reason,
            "timings": self.timings,
            "server_argv": list(self.server_argv),
            "files": self.files,
        }


# ------------------------------------------------------------------ inputs


def load_image(path: Path | str) -> ImageInput:
    """Validate an image before anything is launched: exists, size, decodes, supported format."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"image not found: {path}")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise UsageError(f"image too large: {path} is {size / 2**20:.1f} MiB (limit {MAX_IMAGE_BYTES // 2**20} MiB)")
    raw = path.read_bytes()
    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt = img.format or ""
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise UsageError(f"image too large: {path} is {width}x{height} pixels")
            img.load()  # decode fully: a truncated file fails here, not inside llama-server
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError, ValueError) as e:
        raise UsageError(f"not a readable image: {path} ({e.__class__.__name__})") from e
    if fmt not in IMAGE_FORMATS:
        raise UsageError(f"unsupported image format {fmt or 'unknown'}: {path} (use PNG, JPEG, WEBP, BMP or GIF)")
    data_url = f"data:{IMAGE_FORMATS[fmt]};base64,{base64.b64encode(raw).decode('ascii')}"
    return ImageInput(path=path, format=fmt, width=width, height=height, data_url=data_url)


def build_messages(prompt: str, image_urls: Sequence[str] = (), system: str | None = None) -> list[dict[str, Any]]:
    """OpenAI chat messages (images as data URLs); the text always follows the last image (llama.cpp
    asserts otherwise). The one place that lays out a request, for run, serve clients and bench."""
    if not prompt.strip():
        raise UsageError("the prompt is empty")
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    if image_urls:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
        content.append({"type": "text", "text": prompt})
        messages.append({"role": "user", "content": content})
    else:
        messages.append({"role": "user", "content": prompt})
    return messages


@dataclass(frozen=True)
class ResolvedFiles:
    target: Path
    draft: Path | None
    mmproj: Path | None
    budget: int | None  # the registry's default budget, when the files came from the registry


def _local_or_ref(value: str | Path | None, role: str, *, yes: bool, confirm: Confirm | None,
                  on_progress: Callable[..., None] | None = None) -> Path | None:
    if value is None:
        return None
    text = str(value)
    if text.startswith("hf://"):
        from dsparkcli import hub

        return hub.fetch_ref(text, role=role, yes=yes, confirm=confirm, on_progress=on_progress)
    path = Path(text).expanduser()
    if not path.is_file():
        raise UsageError(f"{role} model not found: {path}")
    return path


def resolve_files(
    *,
    model: str | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    mmproj: str | Path | None = None,
    draft_key: str | None = None,
    no_draft: bool = False,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_progress: Callable[..., None] | None = None,
) -> ResolvedFiles:
    """Local paths and hf:// refs win; otherwise the registry pair (default pair when no --model)."""
    if target is None:
        from dsparkcli import hub, registry

        reg = registry.load_registry()
        pair = reg.get(model) if model else reg.get(reg.default)
        wanted = {"target"} | ({"draft"} if draft is None and not no_draft else set()) | ({"mmproj"} if mmproj is None else set())
        files = hub.ensure_files(pair, draft_key, yes=yes, confirm=confirm, on_progress=on_progress, roles=wanted)
        t = files["target"]
        d = None if no_draft else (_local_or_ref(draft, "draft", yes=yes, confirm=confirm, on_progress=on_progress) or files.get("draft"))
        m = _local_or_ref(mmproj, "mmproj", yes=yes, confirm=confirm, on_progress=on_progress) or files.get("mmproj")
        return ResolvedFiles(target=t, draft=d, mmproj=m, budget=pair.budget)
    if model is not None:
        raise UsageError("give either --model or --target, not both")
    t = _local_or_ref(target, "target", yes=yes, confirm=confirm, on_progress=on_progress)
    assert t is not None
    d = None if no_draft else _local_or_ref(draft, "draft", yes=yes, confirm=confirm, on_progress=on_progress)
    m = _local_or_ref(mmproj, "mmproj", yes=yes, confirm=confirm, on_progress=on_progress)
    return ResolvedFiles(target=t, draft=d, mmproj=m, budget=None)


def check_pairing(files: ResolvedFiles) -> None:
    """Refuse a wrong pair with one line, before llama.cpp can assert on it."""
    if files.draft is None and files.mmproj is None:
        return
    from dsparkcli import inspect as gguf_inspect

    verdict = gguf_inspect.check_pair(files.target, files.draft, files.mmproj)
    if not verdict.ok:
        raise PairingError(f"{files.draft or files.mmproj} does not fit {files.target}: " + "; ".join(verdict.reasons),
                           hint="dspark inspect TARGET DRAFT shows every check")


# ------------------------------------------------------------------ the request


def metrics_or_none(client: ServerClient) -> dict[str, float] | None:
    try:
        return client.metrics()
    except ServerError:
        return None  # a user's server started without --metrics


def stream_chat(
    client: ServerClient,
    payload: dict[str, Any],
    *,
    on_text: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Any], str | None, float, float]:
    """Send one streamed chat request. Returns (text, timings, finish_reason, ttft_s, wall_s)."""
    parts: list[str] = []
    timings: dict[str, Any] = {}
    finish: str | None = None
    started = time.perf_counter()
    ttft = 0.0
    for chunk in client.chat_stream(payload):
        if "timings" in chunk:
            timings = chunk["timings"]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {}).get("content")
            if delta:
                if not parts:
                    ttft = time.perf_counter() - started
                parts.append(delta)
                if on_text:
                    on_text(delta)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    wall = time.perf_counter() - started
    return "".join(parts), timings, finish, ttft, wall


def request_payload(
    messages: list[dict[str, Any]], *, max_tokens: int, temp: float, seed: int | None, ignore_eos: bool = False
) -> dict[str, Any]:
    payload: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": temp, "stream": True}
    if seed is not None:
        payload["seed"] = seed
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


def _result(
    text: str, timings: dict[str, Any], finish: str | None, ttft: float, wall: float,
    before: dict[str, float] | None, after: dict[str, float] | None, *, drafting: bool, budget: int | None,
    argv: Sequence[str] = (), files: dict[str, str] | None = None,
) -> RunResult:
    acceptance = None
    if drafting:
        steps = None
        if before is not None and after is not None:
            steps = int(after.get(M_STEPS, 0) - before.get(M_STEPS, 0))
        acceptance = Acceptance(drafted=int(timings.get("draft_n", 0)), accepted=int(timings.get("draft_n_accepted", 0)),
                                steps=steps)
    return RunResult(
        text=text,
        n_tokens=int(timings.get("predicted_n", 0)),
        prompt_tokens=int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0)),
        decode_tok_s=float(timings.get("predicted_per_second", 0.0)),
        prompt_tok_s=float(timings.get("prompt_per_second", 0.0)),
        ttft_s=ttft,
        wall_s=wall,
        acceptance=acceptance,
        finish_reason=finish,
        timings=dict(timings),
        budget=budget,
        server_argv=tuple(argv),
        files=files or {},
    )


def ask(
    client: ServerClient,
    prompt: str,
    images: Sequence[ImageInput] = (),
    *,
    system: str | None = None,
    max_tokens: int = 256,
    temp: float = 0.0,
    seed: int | None = None,
    drafting: bool | None = None,
    budget: int | None = None,
    on_text: Callable[[str], None] | None = None,
    argv: Sequence[str] = (),
    files: dict[str, str] | None = None,
) -> RunResult:
    """One question to a running server, with acceptance read from its timings and /metrics.

    ``drafting``: True/False when we started the server; None for a user's server (inferred from its answer).
    """
    payload = request_payload(build_messages(prompt, [im.data_url for im in images], system), max_tokens=max_tokens,
                              temp=temp, seed=seed)
    before = metrics_or_none(client) if drafting is not False else None
    text, timings, finish, ttft, wall = stream_chat(client, payload, on_text=on_text)
    after = metrics_or_none(client) if drafting is not False else None
    if drafting is None:
        steps_moved = before is not None and after is not None and after.get(M_STEPS, 0) > before.get(M_STEPS, 0)
        drafting = "draft_n" in timings or steps_moved
    return _result(text, timings, finish, ttft, wall, before, after, drafting=drafting, budget=budget, argv=argv,
                   files=files)


def prepare_server(
    *,
    model: str | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    mmproj: str | Path | None = None,
    draft_key: str | None = None,
    budget: int | None = None,
    no_draft: bool = False,
    p_min: float | None = None,
    ctx: int | None = None,
    threads: int | None = None,
    ngl: str | int | None = None,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    need_vision: bool = False,
    on_progress: Callable[..., None] | None = None,
) -> tuple[ServerConfig, ResolvedFiles]:
    """Files resolved and checked, and the llama-server configuration for them (shared by run and serve)."""
    if budget is not None and budget < 1:
        raise UsageError(f"--budget must be >= 1 (got {budget})")
    if p_min is not None and not 0.0 <= p_min <= 1.0:
        raise UsageError(f"--p-min must be within [0, 1] (got {p_min})")
    files = resolve_files(model=model, target=target, draft=draft, mmproj=mmproj, draft_key=draft_key,
                          no_draft=no_draft, yes=yes, confirm=confirm, on_progress=on_progress)
    if need_vision and files.mmproj is None:
        raise UsageError("images given but no --mmproj (the model's vision projector) is known")
    check_pairing(files)
    n_max = (budget or files.budget or 5) if files.draft else None
    cfg = ServerConfig(
        model=files.target, draft=files.draft, mmproj=files.mmproj, n_max=n_max,
        p_min=p_min if files.draft else None, ctx=ctx, threads=threads, ngl=ngl,
        ngld=ngl if files.draft else None, host=host, port=port, api_key=api_key, extra_args=tuple(extra_args),
    )
    return cfg, files


def run(
    prompt: str,
    images: Sequence[str | Path] = (),
    *,
    model: str | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    mmproj: str | Path | None = None,
    draft_key: str | None = None,
    budget: int | None = None,
    no_draft: bool = False,
    p_min: float | None = None,
    max_tokens: int = 256,
    temp: float = 0.0,
    seed: int | None = None,
    ctx: int | None = None,
    system: str | None = None,
    extra_args: Sequence[str] = (),
    server_url: str | None = None,
    api_key: str | None = None,
    engine: Engine | None = None,
    llama_bin: str | None = None,
    threads: int | None = None,
    ngl: str | int | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_text: Callable[[str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_server: Callable[[LlamaServer], None] | None = None,
    on_progress: Callable[..., None] | None = None,
) -> RunResult:
    """Answer one prompt (with images) through DSpark speculative decoding. Python API of `dspark run`."""
    loaded = [load_image(p) for p in images]
    if server_url:
        if no_draft or budget is not None or p_min is not None:
            raise UsageError("--no-draft, --budget and --p-min are fixed when a server starts; restart it to change them")
        client = ServerClient(server_url, api_key=api_key)
        try:
            return ask(client, prompt, loaded, system=system, max_tokens=max_tokens, temp=temp, seed=seed,
                       drafting=None, budget=None, on_text=on_text)
        finally:
            client.close()

    from dsparkcli import engine as engine_mod

    eng = engine or engine_mod.resolve_engine(llama_bin)
    cfg, files = prepare_server(model=model, target=target, draft=draft, mmproj=mmproj, draft_key=draft_key,
                                budget=budget, no_draft=no_draft, p_min=p_min, ctx=ctx, threads=threads, ngl=ngl,
                                extra_args=extra_args, yes=yes, confirm=confirm, need_vision=bool(loaded),
                                on_progress=on_progress)
    n_max = cfg.n_max
    if on_status:
        on_status(f"loading {files.target.name}" + (f" + draft {files.draft.name} (budget {n_max})" if files.draft else ""))
    file_map = {k: str(v) for k, v in (("target", files.target), ("draft", files.draft), ("mmproj", files.mmproj)) if v}
    with LlamaServer(eng, cfg) as srv:
        if on_server:
            on_server(srv)
        assert srv.client is not None
        try:
            return ask(srv.client, prompt, loaded, system=system, max_tokens=max_tokens, temp=temp, seed=seed,
                       drafting=files.draft is not None, budget=n_max, on_text=on_text,
                       argv=srv.argv, files=file_map)
        except ServerError:
            srv.check_alive()  # a crash mid-generation becomes "llama-server failed during generation: ..."
            raise
