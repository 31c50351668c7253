"""`dspark inspect FILE...`: census, DSpark structure, pairing, per-tensor diff, memory, models.toml check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from dsparkcli import inspect as core
from dsparkcli.cli._common import JsonOpt, LlamaBinOpt, TensorSplitOpt
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.errors import EngineNotFoundError, PairingError, VerificationError
from dsparkcli.gguf.analysis import printable
from dsparkcli.gguf.hashes import TensorDiff
from dsparkcli.gguf.loadable import refuse_unloadable
from dsparkcli.gguf.pairing import PairVerdict
from dsparkcli.llama.engine import resolve_engine
from dsparkcli.llama.loads import engine_label, engine_tables
from dsparkcli.llama.placement import DeviceShare, parse_tensor_split
from dsparkcli.units import format_size

HELP = """Inspect GGUF files from their headers: tensor census, metadata, DSpark structure, pairing.

Give a target and a draft (and optionally an mmproj) to check that they fit: same tokens,
BOS/EOS, hidden size, taps inside the target, a target arch that exposes layer inputs, and
the projector width. Exit 0 when they fit, 1 when they do not. hf://owner/repo[@rev]/file.gguf
reads only the header over HTTP range requests.

Every file is also checked against the llama.cpp engine in use (`dspark doctor`; --llama-bin):
its arch or projector type and every tensor type must be in the engine's tables (exit 3 if not).

\b
Examples:
  dspark inspect draft.gguf                              # census + DSpark structure
  dspark inspect target.gguf draft.gguf mmproj.gguf      # pairing verdict
  dspark inspect new.gguf --against old.gguf             # per-tensor sha256 diff
  dspark inspect draft.gguf --expect minicpm-v-4.7       # compare with models.toml
  dspark inspect target.gguf draft.gguf -c 8192          # weights + KV cache at 8k
  dspark inspect target.gguf draft.gguf -c 8192 --tensor-split 1,1   # ... on each of two devices
  dspark inspect hf://owner/repo@main/model.gguf --json  # header bytes only
"""


def _t(value: Any, max_len: int | None = 120) -> Text:
    """A table cell that rich will not parse as markup, with control characters escaped."""
    return Text(printable("—" if value is None else value, max_len))


def _size(n: int | None) -> str:
    return format_size(n, binary=True)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(x) for x in shape) + ")"


def _mark(ok: bool | None) -> str:
    return {True: "ok", False: "FAIL", None: "?"}[ok]


def _render_file(f: core.FileReport) -> None:
    s = f.summary
    out.print(
        Text(f"{printable(f.spec, 200)}  ({s.role}, {printable(s.arch, 40)}, {_size(f.file_size)})", style="bold")
    )
    meta = Table(show_header=False, box=None, pad_edge=False)
    rows: list[tuple[str, Any]] = [
        ("name", s.name),
        ("blocks", s.blocks),
        ("context", s.context),
        ("embedding", s.embedding),
        ("heads (kv)", None if s.heads is None else f"{s.heads}" + ("" if s.heads_kv is None else f" ({s.heads_kv})")),
        ("vocab", None if s.vocab_size is None else f"{s.vocab_size} tokens, sha256 {s.tokens_sha256[:16]}"),
        ("tokenizer", None if s.tokenizer_model is None else f"{s.tokenizer_model} / {s.tokenizer_pre or '-'}"),
        ("BOS / EOS", None if s.bos is None and s.eos is None else f"{s.bos} / {s.eos}"),
        ("projector", f.mmproj_width),
        (
            "chat template",
            None
            if s.chat_template_chars is None
            else f"{s.chat_template_chars} chars, sha256 {s.chat_template_sha256[:16] if s.chat_template_sha256 else '-'}",
        ),
        ("file type", None if s.file_type is None else f"{s.file_type} {s.file_type_name or ''} (advisory)"),
        ("split", None if s.split is None else f"shard {s.split} (census of this shard only)"),
        ("GGUF", f"v{f.version}, {f.n_kv} keys, alignment {f.alignment}, data at {f.data_offset}"),
    ]
    for label, value in rows:
        if value is not None or (s.role == "target" and label != "split"):
            meta.add_row(label, _t(value))
    out.print(meta)

    c = f.census
    census_line = " + ".join(f"{r.count} {r.type_name}" for r in c.rows)
    out.print(Text(f"{c.n_tensors} tensors = {census_line}" if c.rows else "no tensors"))
    table = Table("type", "tensors", "bytes", "share", "bits/weight", box=None, pad_edge=False)
    for r in c.rows:
        table.add_row(
            r.type_name,
            str(r.count),
            _size(r.n_bytes),
            "?" if r.share is None else f"{r.share * 100:.1f}%",
            "?" if r.bits_per_weight is None else f"{r.bits_per_weight:.2f}",
        )
    bpw = "?" if c.file_bits_per_weight is None else f"{c.file_bits_per_weight:.2f}"
    table.add_row("total", str(c.n_tensors), _size(c.tensor_bytes), "", f"{bpw} (file)")
    out.print(table)
    out.print(f"parameters {c.n_params:,}  file {f.file_size:,} bytes")
    if c.unknown_types:
        out.print(Text(f"warning: unknown tensor types {', '.join(c.unknown_types)} (sizes not counted)"))

    if f.structure is not None:
        st = f.structure
        out.print(Text(f"{st.kind} structure", style="bold"))
        t = Table(show_header=False, box=None, pad_edge=False)
        conf = (
            ("present" if st.confidence_head else "absent")
            + f", has_confidence_head = {'unset' if st.has_confidence_head_key is None else st.has_confidence_head_key}"
            + ("" if st.confidence_head_consistent else "  INCONSISTENT")
        )
        for label, value in (
            ("block size", st.block_size),
            ("target layers", list(st.target_layers)),
            ("mask token id", st.mask_token_id),
            ("Markov rank", st.markov_rank),
            ("sample from anchor", st.sample_from_anchor),
            ("confidence head", conf),
            ("head types", ", ".join(f"{k.split('.')[0]} {v}" for k, v in st.head_types.items())),
            ("required tensors", "all present" if not st.required_missing else f"{len(st.required_missing)} missing"),
            ("max --spec-draft-n-max", st.max_spec_draft_n),
            (
                "draft KV per token",
                None
                if st.kv_bytes_per_token is None
                else f"{st.kv_bytes_per_token:,} B = {st.n_layer} x 2 x {st.n_head_kv} x {st.head_dim} x 2 (f16)",
            ),
        ):
            t.add_row(label, _t(value))
        out.print(t)
        for problem in st.problems:
            out.print(Text(f"warning: {printable(problem, 300)}"))

    for ch in f.engine:
        out.print(
            Text(
                f"{ch.name} {_mark(ch.ok)}: {printable(ch.detail, 300)}",
                style={True: "", False: "bold red", None: "yellow"}[ch.ok],
            )
        )

    if f.file_sha256:
        speed = f" ({f.hash_mb_per_s:.0f} MB/s)" if f.hash_mb_per_s else ""
        out.print(f"sha256 {f.file_sha256}{speed}; {len(f.tensor_sha256 or {})} tensor hashes (--json lists them)")

    if f.memory is not None:
        m = f.memory
        out.print(Text(f"memory at -c {m.ctx}", style="bold"))
        mt = Table(show_header=False, box=None, pad_edge=False)
        for type_name, n in m.weights_by_type.items():
            mt.add_row(f"weights {type_name}", _size(n))
        if m.kv is not None:
            mt.add_row("KV per token", _t(m.kv.formula, None))
            mt.add_row(f"KV at {m.ctx} tokens", _size(m.kv_bytes))
        mt.add_row("total", _size(m.total_bytes))
        out.print(mt)
        for note in m.kv.notes if m.kv else ():
            out.print(Text(f"note: {note}"))
    if f.devices is not None:
        _render_devices(f"per device at -c {f.memory.ctx if f.memory else '?'}", f.devices)

    if f.expect is not None:
        e = f.expect
        how = "expected" if e.explicit else "registry file of the same name"
        out.print(
            Text(
                f"{how}: {e.model} {e.role} '{printable(e.key, 40)}' ({printable(e.pinned_file, 80)})"
                f": {'matches' if e.ok else 'MISMATCH' if e.compared else 'nothing to compare'}",
                style="bold",
            )
        )
        et = Table("check", "result", "pinned", "this file", box=None, pad_edge=False)
        for ch in e.checks:
            et.add_row(
                ch.name,
                "not pinned" if ch.ok is None and ch.expected is None else _mark(ch.ok),
                _t(ch.expected),
                _t(ch.actual),
            )
        out.print(et)
    out.print("")


def _render_devices(title: str, shares: tuple[DeviceShare, ...]) -> None:
    out.print(Text(title, style="bold"))
    t = Table("device", "weights", "KV cache", "total", "layers", box=None, pad_edge=False)
    for d in shares:
        layers = f"{d.layers[0]}-{d.layers[-1]}" if len(d.layers) > 1 else ",".join(map(str, d.layers))
        t.add_row(d.device, _size(d.weights_bytes), _size(d.kv_bytes), _size(d.total_bytes), layers or "-")
    out.print(t)


def _render_diff(d: TensorDiff) -> None:
    out.print(Text(f"diff {printable(d.a, 120)} vs {printable(d.b, 120)}: {d.summary}", style="bold"))
    if d.changed:
        t = Table("changed", "type", "shape", "bytes", box=None, pad_edge=False)
        for c in d.changed:
            t.add_row(
                _t(c.name),
                f"{c.a_type} -> {c.b_type}",
                f"{_shape(c.a_shape)} -> {_shape(c.b_shape)}",
                f"{_size(c.a_bytes)} -> {_size(c.b_bytes)}",
            )
        out.print(t)
    for name, sa, sb in d.respelled:
        out.print(Text(f"same data, shape spelled {_shape(sa)} vs {_shape(sb)}: {printable(name, 80)}"))
    for name in d.only_a:
        out.print(Text(f"only in A: {printable(name, 80)}"))
    for name in d.only_b:
        out.print(Text(f"only in B: {printable(name, 80)}"))
    out.print("")


def _render_pairing(v: PairVerdict) -> None:
    out.print(Text("pairing", style="bold"))
    t = Table("check", "result", "detail", box=None, pad_edge=False)
    for c in v.checks:
        t.add_row(c.name, _mark(c.ok), _t(c.detail, 300))
    out.print(t)
    out.print(
        Text(
            "compatible" if v.ok else f"NOT compatible: {len(v.reasons)} check(s) failed",
            style="bold green" if v.ok else "bold red",
        )
    )


def _json(report: core.InspectReport) -> dict[str, Any]:
    files = []
    for f in report.files:
        files.append(
            {
                "file": f.spec,
                "file_size": f.file_size,
                "gguf_version": f.version,
                "alignment": f.alignment,
                "data_offset": f.data_offset,
                "summary": f.summary,
                "census": f.census,
                "structure": f.structure,
                "file_sha256": f.file_sha256,
                "hash_mb_per_s": f.hash_mb_per_s,
                "memory": f.memory,
                "devices": f.devices,
                "expect": f.expect,
                "engine": f.engine,
                "metadata": f.metadata,
                "tensors": [
                    {
                        "name": t.name,
                        "type": t.type_name,
                        "shape": list(t.shape),
                        "n_elements": t.n_elements,
                        "bytes": t.n_bytes,
                        "offset": t.offset,
                        **({"sha256": f.tensor_sha256.get(t.name)} if f.tensor_sha256 is not None else {}),
                    }
                    for t in f.tensors
                ],
            }
        )
    diff = None
    if report.diff is not None:
        diff = {**report.diff.__dict__, "summary": report.diff.summary}
    return {
        "files": files,
        "pairing": report.pairing,
        "diff": diff,
        "memory_total": report.memory_total,
        "devices_total": report.devices_total,
    }


def inspect(
    files: Annotated[
        list[str], typer.Argument(help="GGUF files (local paths or hf://owner/repo[@rev]/path.gguf).", metavar="FILE")
    ],
    do_hash: Annotated[
        bool, typer.Option("--hash", help="sha256 of the whole file and of every tensor's data.")
    ] = False,
    against: Annotated[
        Optional[str],
        typer.Option("--against", metavar="OTHER", help="Compare every tensor's data with OTHER (sha256)."),
    ] = None,
    expect: Annotated[
        Optional[str],
        typer.Option("--expect", metavar="NAME[:KEY]", help="Compare with size/census/sha256 pinned in models.toml."),
    ] = None,
    ctx: Annotated[
        Optional[int],
        typer.Option("-c", "--ctx-size", metavar="CTX", help="Estimate weights + KV cache memory at this context."),
    ] = None,
    tensor_split: TensorSplitOpt = None,
    draft_device: Annotated[
        Optional[int],
        typer.Option(
            "--draft-device", min=0, metavar="INDEX", help="With --tensor-split: the draft all on this device."
        ),
    ] = None,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    # deferred: rich.progress costs ~30 ms that commands without a bar would pay at start-up
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    try:
        engine = resolve_engine(llama_bin)
    except EngineNotFoundError:
        engine = None  # inspecting needs no engine: the files are then not checked against one
    tables = engine_tables(engine) if engine is not None else None
    columns = (TextColumn("hashing {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=True, disable=json_out or not err.is_terminal) as progress:

        def on_hash(name: str, total: int) -> Callable[[int], None]:
            task = progress.add_task(printable(name.rsplit("/", 1)[-1], 60), total=total)
            return lambda n: progress.advance(task, n)

        report = core.inspect_files(
            files,
            do_hash=do_hash,
            against=against,
            expect=expect,
            ctx=ctx,
            progress=on_hash,
            draft_device=draft_device,
            tables=tables,
            tensor_split=parse_tensor_split(tensor_split) if tensor_split else (),
        )
    for f in report.files:  # on stderr, --json or not: the estimate stands, the context is the user's to fix
        if f.memory is not None and f.memory.past_context:
            err.print(f"warning: {f.memory.past_context}", markup=False)
    if json_out:
        print_json(_json(report))
    else:
        for f in report.files:
            _render_file(f)
        if report.diff is not None:
            _render_diff(report.diff)
        if report.memory_total is not None:
            out.print(
                Text(
                    f"all files at -c {ctx}: {_size(report.memory_total)} (weights + KV caches; the draft's "
                    "context is the target's)",
                    style="bold",
                )
            )
        if report.devices_total is not None and len(report.files) > 1:
            _render_devices(f"all files per device at -c {ctx}", report.devices_total)
        if report.pairing is not None:
            _render_pairing(report.pairing)
    if tables is not None and engine is not None:
        refuse_unloadable([c for f in report.files for c in f.engine], tables, engine_label(engine))
    if report.pairing is not None and not report.pairing.ok:
        raise PairingError("not a compatible pair: " + report.pairing.misfit())
    bad = [f for f in report.files if f.expect is not None and f.expect.explicit and not f.expect.ok]
    if bad and not bad[0].expect.compared:  # type: ignore[union-attr]
        e = bad[0].expect
        raise VerificationError(
            f"nothing to compare: models.toml pins no size, census or sha256 for {e.model} "  # type: ignore[union-attr]
            f"{e.role} '{e.key}' that {bad[0].spec} could be held to"
        )  # type: ignore[union-attr]
    if len(report.files) > 1 and report.pairing is None and report.diff is None:
        roles = [f.summary.role for f in report.files]
        counts = ", ".join(f"{roles.count(r)} {r}{'s' if roles.count(r) > 1 else ''}" for r in dict.fromkeys(roles))
        raise PairingError(f"no pairing verdict for {counts}: a pair is one target with one draft and/or one mmproj")
    if bad:
        what = ", ".join(f"{c.name}" for f in bad for c in f.expect.checks if c.ok is False)  # type: ignore[union-attr]
        raise VerificationError(f"{bad[0].spec} does not match {bad[0].expect.model} in models.toml ({what})")  # type: ignore[union-attr]


def register(app: typer.Typer) -> None:
    app.command("inspect", help=HELP)(inspect)
