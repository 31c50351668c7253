"""Locate llama.cpp, and ask the binary what it can do.

Builds live under ``<cache>/engine/<label>-<backend>-<cpu arch>[-sm<arch>][-rpc][-p<series>]`` (the label
names the tree: a commit, an upstream release, ``src<hash>`` for a tree without either) and carry an
``engine.json`` marker written only after a successful build, so an interrupted build is redone. Making
them is ``llama.building``'s; where their trees come from is ``llama.sources``'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dsparkcli import config
from dsparkcli.errors import EngineCapabilityError, EngineNotFoundError
from dsparkcli.llama import patches as patches_mod

BUILD_TARGETS = ("llama-server", "llama-cli", "llama-quantize", "llama-gguf-split")
# tools/rpc's target (GGML_RPC=ON only): the worker that `dspark rpc-worker` supervises
RPC_SERVER = "ggml-rpc-server"

BUILD_HINT = "build one with: dspark engine build (add --backend cuda on a GPU machine)"


@dataclass(frozen=True)
class Capabilities:
    spec_types: tuple[str, ...]
    draft_dspark: bool
    mmproj: bool
    spec_synth_len: bool
    spec_draft_p_min: bool
    # dspark's patch series (llama.patches): requests' own speculative.n_max / n_min / p_min, and
    # --spec-draft-n-max auto with --spec-cost-table
    request_draft_params: bool = False
    adaptive_budget: bool = False


@dataclass(frozen=True)
class Engine:
    server: Path  # llama-server
    bin_dir: Path
    source: str  # where it was found: flag | env | config | cache | path
    version: str = ""
    commit: str = ""
    backend: str = ""  # cpu | cuda | "" when unknown

    def tool(self, name: str) -> Path:
        """Another binary of the same build (llama-quantize, llama-cli, ...)."""
        path = self.bin_dir / name
        if not path.is_file():
            raise EngineCapabilityError(f"{name} not found next to {self.server}", hint=BUILD_HINT)
        return path


@dataclass(frozen=True)
class BuildRecord:
    commit: str
    backend: str
    cuda_arch: str
    source_dir: str
    bin_dir: str
    targets: list[str] = field(default_factory=list)
    build_seconds: float = 0.0
    built_at: str = ""
    cpu_arch: str = ""
    rpc: bool = False  # GGML_RPC=ON: llama-server takes --rpc and ggml-rpc-server sits in bin_dir
    patches: list[str] = field(default_factory=list)  # the series applied (file names, in order)
    patch_hash: str = ""  # llama.patches.series_hash of them ("" = stock)
    build_source: str = ""  # the patched copy it was compiled from ("" = source_dir itself)
    release: str = ""  # upstream's release of the tree ("" = unknown: a user's tree, or a record before it)
    source_sha256: str = ""  # of the sdist or archive the tree was unpacked from ("" = a user's tree)

    @property
    def compiled_source(self) -> str:  # the tree the binaries were compiled from
        return self.build_source or self.source_dir


# ------------------------------------------------------------------ probing a binary


def _run_probe(server: Path, *args: str, timeout: float = 30.0) -> str:
    try:
        proc = subprocess.run(
            [str(server), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except FileNotFoundError as e:
        raise EngineNotFoundError(f"llama-server not found: {server}", hint=BUILD_HINT) from e
    except PermissionError as e:
        raise EngineNotFoundError(f"llama-server is not executable: {server}") from e
    except OSError as e:  # e.g. exec format error: a binary for another machine
        raise EngineNotFoundError(f"cannot execute {server}: {e.strerror or e}") from e
    except subprocess.TimeoutExpired as e:
        raise EngineNotFoundError(f"{server} {' '.join(args)} did not answer within {timeout:.0f} s") from e
    return proc.stdout + proc.stderr


_VERSION_RE = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s*\S+,\s*commit\s*(?P<commit>[^)\s]+)\)")


def parse_version(text: str) -> tuple[str, str]:
    """(version, commit) from ``llama-server --version`` output; ("", "") if absent. A tree built without
    git metadata says "commit unknown": its version still counts, its commit is ""."""
    m = _VERSION_RE.search(text)
    if not m:
        return "", ""
    commit = m.group("commit")
    return m.group("version"), commit if re.fullmatch(r"[0-9a-fA-F]{4,40}", commit) else ""


def parse_capabilities(help_text: str) -> Capabilities:
    """Read what the binary supports from its ``--help``; nothing is assumed from the version."""
    spec_types: tuple[str, ...] = ()
    for line in help_text.splitlines():
        if "--spec-type" in line:
            # the value list follows on the same line or the next few: collect comma lists of names
            idx = help_text.index(line)
            window = help_text[idx : idx + 800]
            m = re.search(r"((?:[a-z0-9]+(?:-[a-z0-9]+)*,){2,}[a-z0-9]+(?:-[a-z0-9]+)*)", window)
            if m:
                spec_types = tuple(m.group(1).split(","))
            break
    return Capabilities(
        spec_types=spec_types,
        draft_dspark="draft-dspark" in spec_types,
        mmproj=re.search(r"(^|\s)--mmproj[\s,]", help_text, re.M) is not None,
        spec_synth_len="--spec-synth-len" in help_text,
        spec_draft_p_min="--spec-draft-p-min" in help_text,
        request_draft_params="speculative.n_max" in help_text,
        adaptive_budget="--spec-cost-table" in help_text,
    )


def capabilities(engine: Engine) -> Capabilities:
    return parse_capabilities(_run_probe(engine.server, "--help"))


def require_dspark(engine: Engine) -> Capabilities:
    caps = capabilities(engine)
    if not caps.draft_dspark:
        raise EngineCapabilityError(
            f"{engine.server} has no 'draft-dspark' in --spec-type (found: {','.join(caps.spec_types) or 'none'})",
            hint=BUILD_HINT,
        )
    return caps


def supports_rpc(engine: Engine) -> bool:
    """Whether llama-server was built with GGML_RPC=ON. ``--help`` lists ``--rpc`` either way (the flag
    fails at use: "RPC not supported in this build"), so look for the RPC backend next to the binary,
    else ask with an unreachable worker (a build with RPC then aborts on the connection, quietly)."""
    if any(engine.bin_dir.glob("libggml-rpc.*")) or (engine.bin_dir / RPC_SERVER).is_file():
        return True
    try:
        proc = subprocess.run(
            [str(engine.server), "--rpc", "127.0.0.1:1", "--list-devices"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            errors="replace",
            env={**os.environ, "GGML_NO_BACKTRACE": "1"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "RPC not supported" not in proc.stdout + proc.stderr


def require_rpc(engine: Engine) -> None:
    """--rpc needs llama-server built with GGML_RPC=ON; say how to get one before anything starts."""
    if not supports_rpc(engine):
        raise EngineCapabilityError(
            f"{engine.server} was built without the RPC backend (GGML_RPC=ON)",
            hint="build one with: dspark engine build --rpc",
        )


def list_devices(engine: Engine) -> list[str]:
    """Device lines from ``llama-server --list-devices`` (empty on a CPU-only build)."""
    text = _run_probe(engine.server, "--list-devices")
    devices: list[str] = []
    seen_header = False
    for line in text.splitlines():
        if line.strip().startswith("Available devices"):
            seen_header = True
            continue
        if seen_header and line.startswith(" ") and ":" in line:
            devices.append(line.strip())
    return devices


def describe(engine: Engine) -> Engine:
    """The same engine with version, commit and backend filled in from the binary itself."""
    version, commit = parse_version(_run_probe(engine.server, "--version"))
    return Engine(
        engine.server, engine.bin_dir, engine.source, version, commit, engine.backend or describe_backend(engine)
    )


def describe_backend(engine: Engine) -> str:
    """cuda when a CUDA ggml backend library sits next to the binary, else cpu."""
    libs = {p.name for p in engine.bin_dir.glob("libggml-*.so*")}
    return "cuda" if any("cuda" in n for n in libs) else "cpu"


# ------------------------------------------------------------------ resolution


def _as_server(path_text: str, source: str) -> Engine:
    path = Path(path_text).expanduser()
    if path.is_dir():
        for candidate in (
            path / "llama-server",
            path / "bin" / "llama-server",
            path / "build" / "bin" / "llama-server",
        ):
            if candidate.is_file():
                path = candidate
                break
        else:
            raise EngineNotFoundError(f"no llama-server in {path} (from {source})", hint=BUILD_HINT)
    if not path.is_file():
        raise EngineNotFoundError(f"llama-server not found: {path} (from {source})", hint=BUILD_HINT)
    if not os.access(path, os.X_OK):
        raise EngineNotFoundError(f"llama-server is not executable: {path} (from {source})")
    return Engine(server=path.resolve(), bin_dir=path.resolve().parent, source=source)


def engine_root() -> Path:
    return config.engine_dir()


def build_key(
    commit: str,
    backend: str,
    cuda_arch: str = "",
    cpu_arch: str = "x86-64-v3",
    rpc: bool = False,
    patch_hash: str = "",
) -> str:
    return (
        f"{commit}-{backend}-{cpu_arch}"
        + (f"-sm{cuda_arch}" if backend == "cuda" and cuda_arch else "")
        + ("-rpc" if rpc else "")
        + (f"-p{patch_hash}" if patch_hash else "")
    )


def cached_builds() -> list[tuple[Path, BuildRecord]]:
    """Complete builds in the cache, newest first."""
    found = []
    root = engine_root()
    if not root.is_dir():
        return []
    for marker in root.glob("*/engine.json"):
        try:
            data = json.loads(marker.read_text())
            record = BuildRecord(**data)
        except (OSError, ValueError, TypeError):
            continue
        if (Path(record.bin_dir) / "llama-server").is_file():
            found.append((marker, record))
    found.sort(key=lambda item: item[0].stat().st_mtime, reverse=True)
    return found


def resolve_engine(llama_bin: str | None = None, *, backend: str | None = None, rpc: bool = False) -> Engine:
    """Find llama-server: ``--llama-bin``/``DSPARK_LLAMA_BIN``, config file, cache, PATH.

    ``rpc``: the engine must take ``--rpc`` (cached builds without it are passed over; a given binary
    is asked through its ``--help``), so ``run --rpc`` fails in one line before any file is fetched.
    """
    found = _find_engine(llama_bin, backend=backend, rpc=rpc)
    if rpc:
        require_rpc(found)
    return found


def _find_engine(llama_bin: str | None, *, backend: str | None, rpc: bool) -> Engine:
    env = os.environ.get("DSPARK_LLAMA_BIN")
    if llama_bin:
        # the CLI's --llama-bin option reads DSPARK_LLAMA_BIN too (typer's envvar): the same value came from
        # there, and an error naming --llama-bin would send the user looking for an option they never gave
        return _as_server(llama_bin, "DSPARK_LLAMA_BIN" if llama_bin == env else "--llama-bin")
    if env:
        return _as_server(env, "DSPARK_LLAMA_BIN")
    cfg = config.load_config()
    if cfg.llama_bin:
        return _as_server(cfg.llama_bin, f"config {config.config_path()}")
    builds = cached_builds()
    if backend:
        builds = [b for b in builds if b[1].backend == backend]
    if rpc:
        builds = [b for b in builds if b[1].rpc]
    # a GPU build wins over a CPU one; then an RPC build (the same llama-server plus --rpc and the worker);
    # then the shipped patch series (stock unless asked for more), any other series, stock; newest first
    current = patches_mod.series_hash(patches_mod.shipped())
    builds.sort(
        key=lambda b: (
            b[1].backend != "cuda",
            not b[1].rpc,
            b[1].patch_hash != current or not current,
            not b[1].patch_hash,
        )
    )
    if builds:
        _, record = builds[0]
        server = Path(record.bin_dir) / "llama-server"
        return Engine(
            server=server, bin_dir=server.parent, source="cache", commit=record.commit, backend=record.backend
        )
    on_path = shutil.which("llama-server")
    if on_path:
        return _as_server(on_path, "PATH")
    raise EngineNotFoundError(
        "no llama.cpp engine found (no --llama-bin, DSPARK_LLAMA_BIN, config, cache or PATH)", hint=BUILD_HINT
    )
