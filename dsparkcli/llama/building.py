"""Building llama.cpp: ``build_engine`` (which tree, which patch series, the cache key, reuse), cmake's
arguments, and the steps run into one log with progress, under a lock per build folder.

Two ``dspark engine build`` runs of the same engine (a second terminal, ``make demo`` beside ``make test``)
wrote into one build folder and one log at once: the second reconfigured the tree under the first one's
compiler and truncated its log. The lock makes the second wait, then reuse what the first built.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dsparkcli.errors import EngineBuildError, UsageError
from dsparkcli.llama import patches as patches_mod
from dsparkcli.llama import sources
from dsparkcli.llama.engine import (
    BUILD_TARGETS,
    RPC_SERVER,
    BuildRecord,
    Engine,
    build_key,
    cached_builds,
    engine_root,
)
from dsparkcli.units import format_size

ProgressFn = Callable[[float, str], None]
_PCT_RE = re.compile(r"^\[\s*(\d+)%\]")
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")
# the line that says why: the last log line read before the failure was often just the next step's progress
# ("[259/376] Building ...") or, with the log unflushed, the command itself (the H200 build of session 36)
_ERROR_RE = re.compile(r"\berror\b|^FAILED:", re.IGNORECASE)


@contextlib.contextmanager
def build_lock(root: Path, on_progress: ProgressFn | None = None) -> Iterator[None]:
    """Hold ``root``'s build lock (an flock on ``root/.build.lock``), waiting for another holder first."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            if on_progress:
                on_progress(-1.0, f"waiting for another dspark engine build of {root.name} (pid {holder})")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_steps(steps: Sequence[Sequence[str]], log_path: Path, on_progress: ProgressFn | None = None) -> None:
    """Run configure then build, every line into ``log_path``; the build step's percentage to ``on_progress``.
    A failing step is one EngineBuildError naming its last line and the log."""
    with open(log_path, "w", encoding="utf-8") as log:
        for i, cmd in enumerate(steps):
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                list(cmd),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
            )
            last, telling = "", ""
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    last = line.strip() or last
                    if _ERROR_RE.search(line):
                        telling = line.strip()
                    if on_progress:
                        on_progress(_percent(line) if i == 1 else -1.0, line.rstrip())
                rc = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if rc != 0:  # the compiler's or cmake's own error line, else the last line it printed
                raise EngineBuildError(
                    f"{'configure' if i == 0 else 'build'} failed (rc {rc}): {telling or last}",
                    hint=f"full log: {log_path}",
                )


def _percent(line: str) -> float:
    """make's ``[ 42%]`` or ninja's ``[12/230]`` as a percentage; -1 for any other line."""
    m = _NINJA_RE.match(line)
    if m:
        return 100.0 * int(m.group(1)) / max(1, int(m.group(2)))
    m = _PCT_RE.match(line)
    return float(m.group(1)) if m else -1.0


# ------------------------------------------------------------------ a CUDA toolkit that can build ggml

# ggml-cuda links cuBLAS (and cuBLASLt); a toolkit of the compiler alone (nvcc, cudart: what some images and
# pip wheels carry) configured, then stopped at CMake's "Could not find CUBLAS" with a half-built folder behind
CUBLAS_HEADER = "cublas_v2.h"
CUBLAS_LIBS = ("libcublas", "libcublasLt")
_TOP_RE = re.compile(r"^#\$ TOP=(.+)$", re.MULTILINE)
SYSTEM_DIRS = (Path("/usr"),)  # where a distribution's CUDA packages put them (/usr/include, /usr/lib/<triplet>)
DEFAULT_TOOLKIT = Path("/usr/local/cuda")  # FindCUDAToolkit's last resort, NVIDIA's installers' link


def _nvcc(env: Mapping[str, str]) -> Path | None:
    """The CUDA compiler CMake would pick: CUDACXX, else nvcc on PATH."""
    named = env.get("CUDACXX") or shutil.which("nvcc", path=env.get("PATH"))
    return Path(named) if named and Path(named).is_file() else None


def _nvcc_top(nvcc: Path) -> Path | None:
    """The toolkit nvcc belongs to, as nvcc says it (CMake asks it the same way): /usr/local/bin/nvcc may be
    a wrapper script of /usr/local/cuda-13.0/bin/nvcc, whose folder's parent is no toolkit."""
    try:
        proc = subprocess.run(
            [str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _TOP_RE.search(proc.stderr + proc.stdout)
    return Path(m.group(1).strip()).resolve() if m else None


def cuda_roots(env: Mapping[str, str], nvcc: Path | None) -> tuple[Path, ...]:
    """The toolkit folders CMake's FindCUDAToolkit would look in, in its order: CUDAToolkit_ROOT, the
    compiler's toolkit (as nvcc says, then beside the resolved nvcc), CUDA_PATH, CUDA_HOME, /usr/local/cuda."""
    found: list[Path] = []
    named = [env.get("CUDAToolkit_ROOT")]
    if nvcc is not None:
        named += [str(_nvcc_top(nvcc) or ""), str(nvcc.resolve().parent.parent)]
    named += [env.get("CUDA_PATH"), env.get("CUDA_HOME"), str(DEFAULT_TOOLKIT)]
    for text in named:
        if text and Path(text).is_dir() and Path(text).resolve() not in found:
            found.append(Path(text).resolve())
    return tuple(found)


def _has(folders: Sequence[Path], patterns: Sequence[str]) -> bool:
    return any(any(f.glob(p)) for f in folders for p in patterns if f.is_dir())


def missing_cuda(env: Mapping[str, str] | None = None) -> str | None:
    """What ``--backend cuda`` lacks here, in one line with what to do; None when the toolkit has what ggml-cuda
    links. Read from the folders CMake would search (``cuda_roots``, then ``system``); nothing is built."""
    env = os.environ if env is None else env
    nvcc = _nvcc(env)
    roots = cuda_roots(env, nvcc)
    if nvcc is None and not any((r / "bin" / "nvcc").is_file() for r in roots):
        return (
            "--backend cuda needs nvcc, the CUDA compiler, and there is none (PATH, CUDACXX, CUDA_PATH, CUDA_HOME, "
            "/usr/local/cuda): install the CUDA toolkit, or build --backend cpu"
        )
    places = [*roots, *SYSTEM_DIRS]
    includes = [d for r in places for d in (r / "include", *r.glob("targets/*/include"))]
    libs = [d for r in places for d in (r / "lib64", r / "lib", *r.glob("lib/*-linux-gnu"), *r.glob("targets/*/lib"))]
    absent = [CUBLAS_HEADER] if not _has(includes, [CUBLAS_HEADER]) else []
    absent += [lib for lib in CUBLAS_LIBS if not _has(libs, [f"{lib}.so*", f"{lib}_static.a"])]
    if not absent:
        return None
    version = next((m.group(1) for r in roots if (m := re.fullmatch(r"cuda-(\d+\.\d+)", r.name))), None)
    package = f"libcublas-dev-{version.replace('.', '-')}" if version else "libcublas-dev"
    where = ", ".join(str(p) for p in places)
    return (
        f"--backend cuda needs cuBLAS, and this machine has no {_either(absent)} (looked in {where}, where "
        f"CMake looks); install the toolkit's cuBLAS (NVIDIA's CUDA repository: {package}), or put a toolkit "
        "that has it first (its bin/nvcc on PATH, or CUDACXX)"
    )


def _either(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def require_cuda(backend: str) -> None:
    """Refuse a CUDA build that would stop in CMake, before any download or build (``missing_cuda``)."""
    if backend == "cuda" and (why := missing_cuda()) is not None:
        raise EngineBuildError(why)


def _remove_half_built(root: Path) -> int:
    """A failed build's folders (the build tree, the patched copy) removed; its log stays. Returns the bytes
    freed. A failed CUDA build had left 187 MB that no later run reused (engine.json is written last)."""
    freed = 0
    for folder in (root / "build", root / "src"):
        if folder.is_dir():
            freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(folder, ignore_errors=True)
    return freed


# ------------------------------------------------------------------ what a build says before it starts


@dataclass(frozen=True)
class BuildStart:
    """Said once a build really starts (nothing to reuse): its log, its jobs and how long it should take."""

    log: Path
    jobs: int
    expected_seconds: float
    basis: str  # where the expectation comes from: an earlier build here, or the rule of thumb


# compile work of one build in core-seconds, for a machine with no earlier build to go by: the CPU build took
# 444 s on 2 cores (issue 40's `make demo`), the CUDA one (one architecture) about 5 min on 16 cores
_CORE_SECONDS = {"cpu": 900.0, "cuda": 4800.0}


def expected_seconds(backend: str, jobs: int) -> tuple[float, str]:
    """(seconds, basis): the newest complete build of this backend here, else ``_CORE_SECONDS`` over the jobs."""
    past = [r.build_seconds for _, r in cached_builds() if r.backend == backend and r.build_seconds > 0]
    if past:
        return past[0], f"the last {backend} build here took that"
    cores = max(1, min(jobs, os.cpu_count() or jobs))
    return _CORE_SECONDS.get(
        backend, _CORE_SECONDS["cpu"]
    ) / cores, f"a rough guess for {cores} core{'s' if cores != 1 else ''}"


# ------------------------------------------------------------------ the build

BACKENDS = ("cpu", "cuda")
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


def series_note(release: str) -> str:
    """The one line said when a tree builds stock because dspark has no series for its base."""
    bases = ", ".join(patches_mod.SERIES_DIRS)
    return f"stock llama.cpp{f' {release}' if release else ''}: dspark's patch series are for {bases} only"


def _complete(root: Path, rpc: bool) -> bool:
    bin_dir = root / "build" / "bin"
    return (root / "engine.json").is_file() and all(
        (bin_dir / t).is_file() for t in ("llama-server", *build_targets(rpc)[len(BUILD_TARGETS) :])
    )


def _reuse_sdist(
    sdist: sources.SdistSource, backend: str, cuda_arch: str, cpu_arch: str, rpc: bool
) -> tuple[Engine, BuildRecord, bool] | None:
    """A complete cached build of a pinned sdist with its series, found by its key alone (no sources needed:
    a machine whose engine dir was set apart, DSPARK_ENGINE_DIR, may have its sources elsewhere or none)."""
    patch_hash = patches_mod.series_hash(patches_mod.series_for(sdist.release) or ())
    root = engine_root() / build_key(sdist.label, backend, cuda_arch, cpu_arch, rpc, patch_hash)
    if not _complete(root, rpc):
        return None
    try:
        record = BuildRecord(**json.loads((root / "engine.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if sources.sdist_of_tree(Path(record.source_dir)) != sdist or record.patch_hash != patch_hash:
        return None
    bin_dir = root / "build" / "bin"
    return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=sdist.label, backend=backend), record, True


def build_engine(
    *,
    backend: str = "cpu",
    cuda_arch: str = "90",
    cpu_arch: str = "x86-64-v3",
    rpc: bool = True,
    source: Path | None = None,
    ref: str | None = None,
    sha256: str | None = None,
    sdist: sources.SdistSource | None = None,
    sdist_file: Path | None = None,
    patches: bool | None = None,
    jobs: int | None = None,
    force: bool = False,
    on_progress: ProgressFn | None = None,
    on_start: Callable[[BuildStart], None] | None = None,
) -> tuple[Engine, BuildRecord, bool]:
    """Build (or reuse) llama.cpp. Returns (engine, record, reused).

    The tree: a user's ``source`` (only read), upstream's archive of ``ref`` (a release or a commit, checked
    against ``sha256`` or the one dspark knows), or a pinned ``sdist`` (default: the default engine's).
    ``sdist_file``: a pinned sdist already on disk (an offline machine's copy, e.g. from ``pip download
    --no-deps --no-binary xllamacpp xllamacpp==VERSION`` elsewhere): it is known by its sha256 alone and
    copied into the cache, and nothing is downloaded.

    ``patches``: apply dspark's series for the tree's base (``llama.patches``) to a copy of the tree first.
    None = yes for a pinned sdist (wherever its layout was unpacked) and for an archive of a base dspark
    has a series for, no for a user's ``--source`` (their tree gets the default base's series only when
    asked). The series hash is in the cache key: stock and patched builds live side by side.

    ``rpc`` (on by default): GGML_RPC=ON and the ggml-rpc-server target. It adds ``--rpc`` to llama-server
    and one small binary and changes nothing else (same devices, same flags otherwise), so the default
    build, and CI's single build, serve both ``dspark rpc-worker`` and everything else.

    ``on_start`` hears once that a build really starts (``BuildStart``), after every reuse was ruled out.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if cpu_arch not in CPU_ARCHES:
        raise UsageError(f"unknown CPU target {cpu_arch!r}; choose one of {', '.join(CPU_ARCHES)}")
    if source is not None and ref is not None:
        raise UsageError("--source and --ref name two trees: pass one")
    if sha256 is not None and ref is None:
        raise UsageError("--sha256 checks the archive of a --ref: pass --ref too")
    if sdist_file is not None:
        if source is not None or ref is not None:
            raise UsageError("--sdist-file, --source and --ref each name a tree: pass one")
        named, sdist = sdist, sources.sdist_of_file(sdist_file.expanduser())
        if named is not None and named != sdist:
            raise UsageError(
                f"--sdist-file {sdist_file} is {sdist.package}=={sdist.version}, not --sdist {named.package}"
            )
    archive = sources.archive_ref(ref, sha256) if ref is not None else None  # refused before any download
    if shutil.which("cmake") is None:
        raise EngineBuildError(
            "cmake not found on PATH", hint="install cmake (apt-get install cmake or pip install cmake)"
        )
    if source is None and archive is None:
        sdist = sdist or sources.DEFAULT_SDIST
        if not force and patches is not False:
            reused = _reuse_sdist(sdist, backend, cuda_arch, cpu_arch, rpc)
            if reused is not None:
                return reused
        require_cuda(backend)  # before the sdist is fetched or unpacked
        if sdist_file is not None:
            sources.install_sdist_file(sdist_file.expanduser(), sdist)
        source = sources.sdist_tree(sdist, on_line=on_progress)
    elif archive is not None:
        release = archive.ref if archive.is_release else sources.release_of(archive.ref)
        if patches and patches_mod.series_for(release) is None:
            raise UsageError(f"{series_note(release).replace('stock ', '', 1)}: build {archive.ref} without --patches")
        source = sources.archive_tree(archive, on_line=on_progress)
    else:
        source = source.expanduser().resolve()
        if not (source / "CMakeLists.txt").is_file():
            raise UsageError(f"--source {source} is not a llama.cpp tree (no CMakeLists.txt)")
        sdist = sources.sdist_of_tree(source)  # a pinned tree unpacked elsewhere (a GPU bundle) is that sdist
    if archive is not None:
        commit, release = archive.label, (archive.ref if archive.is_release else sources.release_of(archive.ref))
    elif sdist is not None:
        commit, release = sdist.label, sdist.release
    else:
        commit = sources.source_commit(source)
        release = sources.release_of(commit)
    available = patches_mod.series_for(release) if release else None
    if patches is None:
        patches = sdist is not None or (archive is not None and available is not None)
    series = (available if available is not None else patches_mod.shipped()) if patches else ()
    patch_hash = patches_mod.series_hash(series)
    from_sha256 = archive.sha256 if archive else (sdist.sha256 if sdist else "")
    key = build_key(commit, backend, cuda_arch, cpu_arch, rpc, patch_hash)
    root = engine_root() / key
    marker = root / "engine.json"
    bin_dir = root / "build" / "bin"
    targets = build_targets(rpc)
    with build_lock(root, on_progress):  # another build of this engine: wait for it, then reuse it
        if _complete(root, rpc) and not force:
            record = BuildRecord(**json.loads(marker.read_text()))
            if (
                record.source_dir == str(source)
                and record.patch_hash == patch_hash
                and (archive is None or record.source_sha256 == archive.sha256)
            ):
                return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=commit, backend=backend), record, True
        require_cuda(backend)  # a tree from --ref or --source: checked once nothing can be reused
        marker.unlink(missing_ok=True)
        build_source = source
        if series:
            if on_progress:
                on_progress(-1.0, f"applying {len(series)} dspark patches to a copy of {source}")
            build_source = patches_mod.patched_copy(source, root / "src", series)
        # a tree without git metadata (a patched copy, an archive) cannot tell its binaries their commit
        stamp = commit if (series or archive) and re.fullmatch(r"[0-9a-f]{7,40}", commit) else ""
        started = time.monotonic()
        n_jobs = jobs or os.cpu_count() or 2
        if on_start is not None:
            on_start(BuildStart(root / "build.log", n_jobs, *expected_seconds(backend, n_jobs)))
        try:
            run_steps(
                [
                    cmake_configure_args(
                        build_source, root / "build", backend, cuda_arch, cpu_arch, rpc, commit=stamp
                    ),
                    [
                        "cmake",
                        "--build",
                        str(root / "build"),
                        "--config",
                        "Release",
                        "-j",
                        str(n_jobs),
                    ]
                    + ["--target", *targets],
                ],
                root / "build.log",
                on_progress,
            )
        except EngineBuildError as e:  # not Ctrl-C: an interrupted build resumes where it stopped
            freed = _remove_half_built(root)
            raise EngineBuildError(
                e.message, hint=f"{e.hint}; the half-built folder ({format_size(freed)}) was removed"
            ) from None
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
            release=release,
            source_sha256=from_sha256,
        )
        marker.write_text(json.dumps(asdict(record), indent=2))
        return Engine(bin_dir / "llama-server", bin_dir, "cache", commit=commit, backend=backend), record, False
