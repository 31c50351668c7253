"""Locate or build llama.cpp, and ask the binary what it can do.

The engine is the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python (pinned below), or a
user's checkout. Builds live under ``<cache>/engine/<commit>-<backend>[-sm<arch>]`` and carry an
``engine.json`` marker written only after a successful build, so an interrupted build is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsparkcli import config
from dsparkcli.errors import EngineBuildError, EngineCapabilityError, EngineNotFoundError, UsageError
from dsparkcli.llama import patches as patches_mod
from dsparkcli.llama.building import build_lock, run_steps

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
PINNED_COMMIT = "0c1e570"
BUILD_TARGETS = ("llama-server", "llama-cli", "llama-quantize", "llama-gguf-split")
# tools/rpc's target (GGML_RPC=ON only): the worker that `dspark rpc-worker` supervises
RPC_SERVER = "ggml-rpc-server"
BACKENDS = ("cpu", "cuda")

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


_VERSION_RE = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s*\S+,\s*commit\s*(?P<commit>[0-9a-fA-F]+)\)")


def parse_version(text: str) -> tuple[str, str]:
    """(version, commit) from ``llama-server --version`` output; ("", "") if absent."""
    m = _VERSION_RE.search(text)
    return (m.group("version"), m.group("commit")) if m else ("", "")


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


CPU_ARCHES = ("x86-64-v3", "native")

# Why not -march=native by default: on CPUs that advertise AMX, ggml's AMX Q8_0 kernel dies with SIGILL
# where the kernel or a sandbox withholds the AMX tile state (seen on this project's CI machines), and a
# native build is not portable to another machine sharing the cache. x86-64-v3 (AVX2, FMA, F16C, BMI2)
# runs everywhere dspark is likely to, and the GPU does the heavy lifting in CUDA builds anyway.
_CPU_ARCH_FLAGS = {
    "x86-64-v3": [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
    ],
    "native": ["-DGGML_NATIVE=ON"],
}


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
    if llama_bin:
        return _as_server(llama_bin, "--llama-bin")
    env = os.environ.get("DSPARK_LLAMA_BIN")
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


# ------------------------------------------------------------------ building

ProgressFn = Callable[[float, str], None]


def _sdist_dir() -> Path:
    return config.engine_source_dir()


def vendored_source_dir() -> Path:
    """Where the pinned tree lives in the cache (whether or not it is there yet)."""
    return _sdist_dir() / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"


def vendored_source(*, on_line: ProgressFn | None = None) -> Path:
    """The llama.cpp tree from the pinned sdist, downloaded with pip once and kept in the cache."""
    src_root = _sdist_dir()
    tree = vendored_source_dir()
    if (tree / "CMakeLists.txt").is_file():
        return tree
    src_root.mkdir(parents=True, exist_ok=True)
    archive = next(src_root.glob(f"llama_cpp_python-{SDIST_VERSION}.tar.gz"), None)
    if archive is None:
        if on_line:
            on_line(0.0, f"downloading {SDIST_PACKAGE}=={SDIST_VERSION} sdist with pip")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{SDIST_PACKAGE}=={SDIST_VERSION}",
            "-d",
            str(src_root),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        archive = next(src_root.glob(f"llama_cpp_python-{SDIST_VERSION}.tar.gz"), None)
        if proc.returncode != 0 or archive is None:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EngineBuildError(
                f"pip could not download {SDIST_PACKAGE}=={SDIST_VERSION}: {last[0]}",
                hint="check network access to PyPI, or pass --source DIR",
            )
    if on_line:
        on_line(0.0, f"extracting {archive.name}")
    staging = src_root / ".extract"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tf:
        tf.extractall(staging, filter="data")
    shutil.rmtree(src_root / f"llama_cpp_python-{SDIST_VERSION}", ignore_errors=True)
    (staging / f"llama_cpp_python-{SDIST_VERSION}").rename(src_root / f"llama_cpp_python-{SDIST_VERSION}")
    shutil.rmtree(staging, ignore_errors=True)
    return tree


def source_commit(source: Path) -> str:
    """Short commit of a llama.cpp tree: git if it is a checkout, else the pinned one for the sdist."""
    try:
        # only a checkout whose top is this very tree: a source dir that merely sits inside some other
        # repository (a dotfiles home, a project folder) must not take that repository's commit
        proc = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--show-toplevel", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        lines = proc.stdout.split()
        if proc.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == source.resolve():
            return lines[1]
    except (OSError, subprocess.TimeoutExpired):
        pass
    if f"llama_cpp_python-{SDIST_VERSION}" in str(source):
        return PINNED_COMMIT
    return "src" + hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:8]


def build_targets(rpc: bool) -> tuple[str, ...]:
    return BUILD_TARGETS + ((RPC_SERVER,) if rpc else ())


def cmake_configure_args(
    source: Path,
    build_dir: Path,
    backend: str,
    cuda_arch: str,
    cpu_arch: str = "x86-64-v3",
    rpc: bool = False,
    commit: str = "",
) -> list[str]:
    """``commit``: stamped into the binaries (``--version``) when the tree cannot tell it itself: a
    patched copy has no git metadata, and its binaries are still that commit's llama.cpp."""
    args = [
        "cmake",
        "-S",
        str(source),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
    ]
    if commit:
        args += [f"-DLLAMA_BUILD_COMMIT={commit}"]
    # a generator is fixed at the first configure; naming another one later fails, so only pick it then
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").is_file():
        args += ["-G", "Ninja"]
    if platform.machine() in ("x86_64", "AMD64"):
        args += _CPU_ARCH_FLAGS[cpu_arch]
    if backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    if rpc:
        args += ["-DGGML_RPC=ON"]
    return args


def _reuse_pinned(backend: str, cuda_arch: str, cpu_arch: str, rpc: bool) -> tuple[Engine, BuildRecord, bool] | None:
    """A complete cached build of the pinned sdist with the shipped series, if there is one."""
    patch_hash = patches_mod.series_hash(patches_mod.shipped())
    root = engine_root() / build_key(PINNED_COMMIT, backend, cuda_arch, cpu_arch, rpc, patch_hash)
    marker, bin_dir = root / "engine.json", root / "build" / "bin"
    if not marker.is_file() or not all(
        (bin_dir / t).is_file() for t in ("llama-server", *build_targets(rpc)[len(BUILD_TARGETS) :])
    ):
        return None
    try:
        record = BuildRecord(**json.loads(marker.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    pinned = Path(record.source_dir).parts[-3:] == vendored_source_dir().parts[-3:]
    if not pinned or record.patch_hash != patch_hash:
        return None
    return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=PINNED_COMMIT, backend=backend), record, True


def build_engine(
    *,
    backend: str = "cpu",
    cuda_arch: str = "90",
    cpu_arch: str = "x86-64-v3",
    rpc: bool = True,
    source: Path | None = None,
    patches: bool | None = None,
    jobs: int | None = None,
    force: bool = False,
    on_progress: ProgressFn | None = None,
) -> tuple[Engine, BuildRecord, bool]:
    """Build (or reuse) llama.cpp. Returns (engine, record, reused).

    ``patches``: apply dspark's series (``llama.patches``) to a copy of the tree first. None = yes for the
    pinned tree (wherever its sdist layout was unpacked), no for a user's ``--source`` (their tree gets
    them only when asked). The series hash is in the cache key: stock and patched builds live side by side.

    ``rpc`` (on by default): GGML_RPC=ON and the ggml-rpc-server target. It adds ``--rpc`` to llama-server
    and one small binary and changes nothing else (same devices, same flags otherwise), so the default
    build, and CI's single build, serve both ``dspark rpc-worker`` and everything else.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if cpu_arch not in CPU_ARCHES:
        raise UsageError(f"unknown CPU target {cpu_arch!r}; choose one of {', '.join(CPU_ARCHES)}")
    if shutil.which("cmake") is None:
        raise EngineBuildError(
            "cmake not found on PATH", hint="install cmake (apt-get install cmake or pip install cmake)"
        )
    user_tree = source is not None
    if not user_tree and not force and patches is not False:
        # the pinned tree's build is found by its key alone: no sources needed to reuse it (a machine whose
        # engine dir was set apart, DSPARK_ENGINE_DIR, may have its sources elsewhere or none)
        reused = _reuse_pinned(backend, cuda_arch, cpu_arch, rpc)
        if reused is not None:
            return reused
    if source is not None:
        source = source.expanduser().resolve()
        if not (source / "CMakeLists.txt").is_file():
            raise UsageError(f"--source {source} is not a llama.cpp tree (no CMakeLists.txt)")
    else:
        source = vendored_source(on_line=on_progress)
    if patches is None:  # the pinned tree, also where a GPU bundle unpacks it (its sdist layout), gets them
        patches = not user_tree or source.parts[-3:] == vendored_source_dir().parts[-3:]
    series = patches_mod.shipped() if patches else ()
    patch_hash = patches_mod.series_hash(series)
    commit = source_commit(source)
    key = build_key(commit, backend, cuda_arch, cpu_arch, rpc, patch_hash)
    root = engine_root() / key
    marker = root / "engine.json"
    bin_dir = root / "build" / "bin"
    targets = build_targets(rpc)
    with build_lock(root, on_progress):  # another build of this engine: wait for it, then reuse it
        if (
            marker.is_file()
            and not force
            and all((bin_dir / t).is_file() for t in ("llama-server", *targets[len(BUILD_TARGETS) :]))
        ):
            record = BuildRecord(**json.loads(marker.read_text()))
            if record.source_dir == str(source) and record.patch_hash == patch_hash:
                return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=commit, backend=backend), record, True
        marker.unlink(missing_ok=True)
        build_source = source
        if series:
            if on_progress:
                on_progress(-1.0, f"applying {len(series)} dspark patches to a copy of {source}")
            build_source = patches_mod.patched_copy(source, root / "src", series)
        started = time.monotonic()
        run_steps(
            [
                cmake_configure_args(
                    build_source, root / "build", backend, cuda_arch, cpu_arch, rpc, commit=commit if series else ""
                ),
                [
                    "cmake",
                    "--build",
                    str(root / "build"),
                    "--config",
                    "Release",
                    "-j",
                    str(jobs or os.cpu_count() or 2),
                    "--target",
                    *targets,
                ],
            ],
            root / "build.log",
            on_progress,
        )
        record = BuildRecord(
            commit=commit,
            backend=backend,
            cuda_arch=cuda_arch if backend == "cuda" else "",
            source_dir=str(source),
            bin_dir=str(bin_dir),
            targets=list(targets),
            build_seconds=round(time.monotonic() - started, 1),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            cpu_arch=cpu_arch,
            rpc=rpc,
            patches=[p.name for p in series],
            patch_hash=patch_hash,
            build_source=str(build_source) if series else "",
        )
        marker.write_text(json.dumps(asdict(record), indent=2))
        return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=commit, backend=backend), record, False
