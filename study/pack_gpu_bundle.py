#!/usr/bin/env python3
"""Prepare `.gpu/` (git-ignored) for a device call: what the offline GPU machine lacks.

The H200 machine has numpy, torch, CMake, Ninja, nvcc 13 and Python 3.12 but no network, and a call
carries at most 64 MiB of ignored files. This writes:

  .gpu/llama.cpp.tar.xz   the default engine's vendored llama.cpp tree (b11549, from xllamacpp's sdist)
                          without models/*.gguf*, docs, media, benches, .git, and what a CUDA build of
                          the server does not compile (tests, examples, the python converters, the other GPU backends): 8 MB instead
                          of 11, since a call carries 64 MiB with the repo (tools/ui stays: the server
                          target needs it)
  .gpu/wheels/*.whl       dspark's runtime dependency closure, as cp312 manylinux wheels
                          (numpy and anything else already on the machine are left out)
  .gpu/BUNDLE.json        what is in it, with sizes and sha256

Run with the project venv (it reads installed versions from it):
    .venv/bin/python -m study.pack_gpu_bundle            # then carry [".gpu"] in the device call
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

from dsparkcli.llama import sources

REPO = Path(__file__).resolve().parent.parent
# the default engine's tree as `dspark engine build` unpacks it (its sdist's layout, which gpu_study.sh keeps)
DEFAULT_TREE = sources.sdist_tree_dir(sources.DEFAULT_SDIST)
ON_GPU_MACHINE = {"numpy", "torch", "pip", "setuptools", "wheel", "cmake", "ninja"}
# optional heavy deps used lazily by commands the study does not run (report plots)
SKIP_BY_DEFAULT = {
    "matplotlib",
    "contourpy",
    "cycler",
    "fonttools",
    "kiwisolver",
    "pyparsing",
    "python-dateutil",
    "six",
}
EXCLUDE_DIRS = {".git", "docs", "media", "benches", "__pycache__", ".github", ".devops"}
# not compiled by the CUDA server build (LLAMA_BUILD_TESTS/EXAMPLES=OFF; ggml adds a backend's folder only
# when it is switched on); ggml-hip and ggml-musa stay, they compile ggml-cuda's sources
# (scripts/ stays: tools/ui's build runs scripts/ui-assets.cmake; the H200 build of session 36 failed without it)
EXCLUDE_TOP = {"tests", "examples", "conversion", "gguf-py", "grammars", "prompts", "ci"}
EXCLUDE_BACKENDS = {
    "ggml-sycl",
    "ggml-vulkan",
    "ggml-opencl",
    "ggml-hexagon",
    "ggml-metal",
    "ggml-et",
    "ggml-webgpu",
    "ggml-openvino",
    "ggml-cann",
    "ggml-virtgpu",
    "ggml-zdnn",
    "ggml-zendnn",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(root: str = "dspark", skip: set[str] | None = None) -> dict[str, str]:
    """{distribution: installed version} reachable from ``root`` (no extras; markers evaluated here)."""
    from packaging.requirements import Requirement

    skip = {_norm(s) for s in (skip or set())}
    seen: dict[str, str] = {}
    todo = [root]
    env = {
        "python_version": "3.12",
        "python_full_version": "3.12.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"warning: {name} is not installed here; skipped", file=sys.stderr)
            continue
        key = _norm(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = dist.version
        for req_text in dist.requires or []:
            req = Requirement(req_text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # extras and other platforms
            if _norm(req.name) not in skip and _norm(req.name) not in seen:
                todo.append(req.name)
    seen.pop(_norm(root), None)
    return seen


def download_wheels(pins: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, version in sorted(pins.items()):
        if any(_norm(p.name.split("-")[0]) == name and f"-{version}-" in p.name for p in dest.glob("*.whl")):
            continue
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--abi",
            "cp312",
            "--abi",
            "abi3",
            "--abi",
            "none",
        ]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        cmd += ["--platform", "any", "-d", str(dest), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip download {name}=={version} failed:\n{proc.stderr.strip()[-800:]}")


def _keep(path: Path, tree: Path) -> bool:
    rel = path.relative_to(tree)
    if any(part in EXCLUDE_DIRS for part in rel.parts):
        return False
    if len(rel.parts) > 1 and rel.parts[0] in EXCLUDE_TOP:
        return False
    if rel.parts[:2] == ("ggml", "src") and len(rel.parts) > 3 and rel.parts[2] in EXCLUDE_BACKENDS:
        return False
    if rel.parts[0] == "models" and ".gguf" in path.name:
        return False
    return True


def _git(tree: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=20)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def build_info_patch(tree: Path) -> tuple[bytes, str, str]:
    """cmake/build-info.cmake with the commit baked in: without .git the GPU build would say 'unknown'
    in `llama-server --version`, and every record's engine commit with it. A pinned sdist's tree whose
    commit is not known (b11549's) keeps 'unknown': dspark names that build by its release."""
    sdist = sources.sdist_of_tree(tree.resolve())
    commit = _git(tree, "rev-parse", "--short", "HEAD") or (sdist.commit if sdist else "")
    if not commit:
        return (tree / "cmake" / "build-info.cmake").read_bytes(), "unknown", "0"
    number = _git(tree, "rev-list", "--count", "HEAD") or "0"
    text = (tree / "cmake" / "build-info.cmake").read_text()
    patched = text.replace('set(BUILD_COMMIT "unknown")', f'set(BUILD_COMMIT "{commit}")', 1)
    patched = patched.replace("set(BUILD_NUMBER 0)", f"set(BUILD_NUMBER {number})", 1)
    if patched == text:
        raise SystemExit("cmake/build-info.cmake has changed shape; cannot bake the commit in")
    return patched.encode(), commit, number


def pack_tree(tree: Path, out: Path) -> int:
    if not (tree / "CMakeLists.txt").is_file():
        raise SystemExit(
            f"{tree} is not a llama.cpp tree; build the CPU engine once (dspark engine build) or pass --tree"
        )
    if not (tree / "tools" / "ui").is_dir():
        raise SystemExit(f"{tree}/tools/ui is missing: llama-server's build needs it")
    files = sorted(p for p in tree.rglob("*") if (p.is_file() or p.is_symlink()) and _keep(p, tree))
    build_info, commit, number = build_info_patch(tree)
    tmp = out.with_suffix(".part")
    with tarfile.open(tmp, "w:xz", preset=6) as tf:
        for p in files:
            arcname = str(Path("llama.cpp") / p.relative_to(tree))
            if p.relative_to(tree) == Path("cmake/build-info.cmake"):
                info = tf.gettarinfo(str(p), arcname=arcname)
                info.size = len(build_info)
                tf.addfile(info, io.BytesIO(build_info))
                continue
            tf.add(p, arcname=arcname, recursive=False)
    tmp.replace(out)
    print(f"baked commit {commit} (build {number}) into cmake/build-info.cmake")
    return len(files)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--tree", type=Path, default=DEFAULT_TREE, help="llama.cpp source tree to pack")
    ap.add_argument("--with-plots", action="store_true", help="also ship matplotlib and its dependencies")
    ap.add_argument("--max-mib", type=float, default=60.0)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    tar_path = out / "llama.cpp.tar.xz"
    n_files = pack_tree(args.tree.expanduser(), tar_path)
    skip = set(ON_GPU_MACHINE) | (set() if args.with_plots else SKIP_BY_DEFAULT)
    pins = dependency_closure("dspark", skip)
    wheels = out / "wheels"
    for old in wheels.glob("*.whl"):  # a bundle matches the venv it was made from, nothing else
        if not any(_norm(old.name.split("-")[0]) == n and f"-{v}-" in old.name for n, v in pins.items()):
            old.unlink()
    download_wheels(pins, wheels)

    entries = [
        {"path": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": sha256(p)}
        for p in [tar_path, *sorted(wheels.glob("*.whl"))]
    ]
    total = sum(e["bytes"] for e in entries)
    bundle = {
        "llama_cpp_tree": str(args.tree),
        "tree_files": n_files,
        "pins": pins,
        "files": entries,
        "total_bytes": total,
    }
    (out / "BUNDLE.json").write_text(json.dumps(bundle, indent=2) + "\n")
    print(f"{tar_path.name}: {tar_path.stat().st_size / 2**20:.1f} MiB ({n_files} files)")
    print(
        f"wheels: {len(entries) - 1} ({sum(e['bytes'] for e in entries[1:]) / 2**20:.1f} MiB): "
        + ", ".join(f"{n}=={v}" for n, v in sorted(pins.items()))
    )
    print(f"total {total / 2**20:.1f} MiB in {out}")
    if total > args.max_mib * 2**20:
        print(f"error: bundle is over {args.max_mib} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
