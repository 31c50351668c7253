"""`dspark engine build|path`: build llama.cpp with DSpark support, or show which one is used."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import JsonOpt, LlamaBinOpt
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.errors import UsageError
from dsparkcli.llama import building, sources
from dsparkcli.llama import engine as core

BUILD_EXAMPLES = f"""Build {sources.DEFAULT_SDIST.describe()} from the {sources.DEFAULT_SDIST.package} \
{sources.DEFAULT_SDIST.version} sdist into the dspark cache (or another tree: --sdist, --ref, --source).

\b
Examples:
  dspark engine build                          # CPU build with the RPC backend, reused on the next call
  dspark engine build --no-rpc                 # without GGML_RPC (no --rpc, no rpc-worker)
  dspark engine build --backend cuda --cuda-arch 90 --jobs 16
  dspark engine build --no-patches             # stock llama.cpp, without dspark's patch series
  dspark engine build --sdist llama-cpp-python # llama.cpp b11312 (0c1e570), with the series made for it
  dspark engine build --sdist-file xllamacpp-2026.10.11549.tar.gz --backend cuda   # offline: no download
  dspark engine build --ref b11600 --sha256 HEX  # upstream's source archive of a release (or a commit)
  dspark engine build --source ~/src/llama.cpp # your own checkout (stock; add --patches for the series)
"""
SDIST_NAMES = ", ".join(f"{s.package} ({s.release})" for s in sources.SDISTS)


def build(
    backend: Annotated[str, typer.Option("--backend", "-b", help="cpu or cuda.")] = "cpu",
    cuda_arch: Annotated[str, typer.Option("--cuda-arch", help="CUDA architecture(s), e.g. 90 for H100/H200.")] = "90",
    cpu_arch: Annotated[
        str, typer.Option("--cpu-arch", help="x86-64-v3 (portable, default) or native.")
    ] = "x86-64-v3",
    rpc: Annotated[
        bool,
        typer.Option(
            "--rpc/--no-rpc",
            help="The RPC backend (GGML_RPC=ON) and its worker, for --rpc and dspark rpc-worker (part of the cache key).",
        ),
    ] = True,
    source: Annotated[Optional[Path], typer.Option("--source", help="Build this llama.cpp checkout instead.")] = None,
    ref: Annotated[
        Optional[str],
        typer.Option(
            "--ref",
            help=f"Build upstream's source archive of this release (b11549) or commit, verified by sha256 "
            f"(base URL: ${sources.ARCHIVE_URL_ENV}, default {sources.ARCHIVE_URL}).",
        ),
    ] = None,
    sha256: Annotated[
        Optional[str],
        typer.Option("--sha256", help="The sha256 of --ref's archive, for a release dspark does not know."),
    ] = None,
    sdist: Annotated[
        Optional[str],
        typer.Option("--sdist", help=f"Build the llama.cpp tree a pinned PyPI sdist vendors: {SDIST_NAMES}."),
    ] = None,
    sdist_file: Annotated[
        Optional[Path],
        typer.Option(
            "--sdist-file",
            help="Build offline from a pinned sdist file already on this machine (known by its sha256; "
            "nothing is downloaded). See docs/ENGINE.md.",
        ),
    ] = None,
    patches: Annotated[
        Optional[bool],
        typer.Option(
            "--patches/--no-patches",
            help="Apply dspark's patch series (per-request draft settings, --spec-draft-n-max auto) to a copy of the tree first (default: yes for a pinned sdist and a --ref release dspark has a series for, no for --source). Part of the cache key.",
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        Optional[int], typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs (default: all cores).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a cached build exists.")] = False,
    json_out: JsonOpt = False,
) -> None:
    # deferred: rich.progress costs ~30 ms that commands without a bar would pay at start-up
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = not json_out and err.is_terminal
    done = {"pct": -1.0}
    beat = Heartbeat(
        HEARTBEAT_SECONDS,
        lambda elapsed: err.print(
            f"still building llama.cpp ({backend}) after {_duration(elapsed)}"
            + (f": {done['pct']:.0f} %" if done["pct"] >= 0 else ""),
            markup=False,
        ),
    )

    def on_start(start: building.BuildStart) -> None:
        if bar:  # the bar shows the same, live
            return
        # off a terminal (`make demo > log`) the bar is off: nothing was said for 444 s, then "built in 444 s"
        jobs_said = f"{start.jobs} job{'s' if start.jobs != 1 else ''}"
        err.print(
            f"building llama.cpp ({backend}) with {jobs_said}: about {_duration(start.expected_seconds)} "
            f"({start.basis}); log: {start.log}",
            markup=False,
        )
        beat.start()

    with (
        beat,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[line]}"),
            console=err,
            transient=True,
            disable=not bar,
        ) as progress,
    ):  # off a terminal: no bar, no stray newline (the lines of on_start and the heartbeat instead)
        task = progress.add_task(f"building llama.cpp ({backend})", total=100, line="")

        def on_progress(pct: float, line: str) -> None:
            if pct >= 0:
                done["pct"] = pct
            fields = {"line": line[-60:]}
            if pct >= 0:
                progress.update(task, completed=pct, **fields)
            else:
                progress.update(task, **fields)

        eng, record, reused = building.build_engine(
            backend=backend,
            cuda_arch=cuda_arch,
            cpu_arch=cpu_arch,
            rpc=rpc,
            source=source,
            ref=ref,
            sha256=sha256,
            sdist=_sdist(sdist, source, ref),
            sdist_file=sdist_file,
            patches=patches,
            jobs=jobs,
            force=force,
            on_progress=on_progress,
            on_start=on_start,
        )
    if json_out:
        print_json({"server": eng.server, "reused": reused, **record.__dict__})
        return
    what = "reused cached build" if reused else f"built in {record.build_seconds:.0f} s"
    out.print(f"{what}: {eng.server}")
    out.print(
        (f"llama.cpp {record.release}, " if record.release and record.release != record.commit else "")
        + f"commit {record.commit}, backend {record.backend}"
        + (f", sm{record.cuda_arch}" if record.cuda_arch else "")
        + (", rpc" if record.rpc else "")
        + (f", patches {record.patch_hash}" if record.patch_hash else ", stock")
    )
    for name in record.patches:
        out.print(f"  patch {name}")
    if ref is not None and patches is None and not record.patches:
        out.print(building.series_note(record.release))


HEARTBEAT_SECONDS = 30.0  # off a terminal, a line this often while the engine builds


class Heartbeat:
    """``say(seconds since start)`` every ``every`` seconds from a thread, from ``start()`` until the ``with``
    block ends: a log (or CI) sees that a long build is alive, also through one silent 3-minute CUDA compile."""

    def __init__(self, every: float, say: Callable[[float], None]) -> None:
        self._every, self._say = every, say
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        started = time.monotonic()

        def beat() -> None:
            while not self._stop.wait(self._every):
                self._say(time.monotonic() - started)

        self._thread = threading.Thread(target=beat, name="dspark-heartbeat", daemon=True)
        self._thread.start()

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _sdist(name: str | None, source: Path | None, ref: str | None) -> sources.SdistSource | None:
    """--sdist's pinned source; one line for a name dspark does not pin or a second tree named."""
    if name is None:
        return None
    if source is not None or ref is not None:
        raise UsageError("--sdist, --source and --ref each name a tree: pass one")
    found = next((s for s in sources.SDISTS if name in (s.package, f"{s.package}=={s.version}")), None)
    if found is None:
        raise UsageError(f"--sdist {name!r} is not one dspark pins; choose one of {SDIST_NAMES}")
    return found


def path(llama_bin: LlamaBinOpt = None, json_out: JsonOpt = False) -> None:
    """Print the llama-server binary dspark would use.

    \b
    Examples:
      dspark engine path
      dspark engine path --json      # also its folder, where it was found, its commit and backend
      DSPARK_LLAMA_BIN=/opt/llama.cpp/build/bin dspark engine path
    """
    eng = core.resolve_engine(llama_bin)
    if json_out:  # what resolve_engine knows without running the binary (doctor runs it)
        print_json({
            "server": str(eng.server), "bin_dir": str(eng.bin_dir), "source": eng.source,
            "commit": eng.commit or None, "backend": eng.backend or None,
        })  # fmt: skip
        return
    out.print(str(eng.server), markup=False)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Build or locate the llama.cpp engine.", no_args_is_help=True)
    sub.command("build", help=BUILD_EXAMPLES)(build)
    sub.command("path")(path)
    app.add_typer(sub, name="engine")
