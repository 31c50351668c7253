"""Where dspark may write: the one check every command that writes a file or a folder makes before it starts.

An output is a regular file (or a path that does not exist yet) in a folder that exists and is writable, or
a folder (or a new path) for the commands that fill one. Never a device (`--force` once turned /dev/full
into a regular file), a FIFO or a socket, never a directory where a file is wanted, never one of the
command's own inputs. Checked up front, so a long job cannot end on a path it could never write.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from dsparkcli.errors import UsageError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _writable_folder(folder: Path, what: str, path: Path) -> None:
    if not folder.is_dir():
        raise UsageError(f"{what} {path}: folder {folder} does not exist")
    _not_kernel_files(folder, f"{what} {path}: {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: folder {folder} is not writable")


def _not_kernel_files(folder: Path, named: str) -> None:
    if _kernel_files(folder):
        raise UsageError(f"{named} is a kernel filesystem (like /proc, /sys): nothing written there is kept")


def _kernel_files(folder: Path) -> bool:
    """A filesystem with neither blocks nor inodes (proc, sysfs) keeps nothing written to it; root's
    access() still says yes there, and the write fails later ("Invalid argument") or changes the kernel."""
    try:
        fs = os.statvfs(folder)
    except OSError:
        return False
    return fs.f_blocks == 0 and fs.f_files == 0


def check_output_file(
    path: str | os.PathLike[str],
    *,
    what: str = "output",
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    replace: bool = True,
    force_hint: str = "--force",
) -> Path:
    """``path`` as a file this command may write (create, or replace when ``replace``); UsageError otherwise.

    ``inputs``: the command's own input files, which the output must not be (by name or by inode)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()  # follows symlinks: a link to /dev/full is a device
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"{what} {p}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {p} is {_kind(st.st_mode)}: give a regular file or a new path")
    if p.resolve().parent.is_dir():  # before access(), which says no to a user and yes to root there
        _not_kernel_files(p.resolve().parent, f"{what} {p}: {p.resolve().parent}")
    for src in inputs:
        if src is None:
            continue
        s = Path(src).expanduser()
        if p.resolve() == s.resolve() or (st is not None and s.exists() and os.path.samefile(s, p)):
            raise UsageError(f"{what} {p} is the input {s}: give another path")
    if st is not None and not replace:
        raise UsageError(f"{what} exists: {p} (pass {force_hint} to replace it)")
    if st is not None and not os.access(p, os.W_OK):
        raise UsageError(f"{what} {p} is not writable")
    _writable_folder(p.resolve().parent, what, p)
    if st is not None:
        try:  # opened as the writers open it, nothing written: what access() cannot know (root, odd files)
            with open(p, "ab"):
                pass
        except OSError as e:
            raise UsageError(f"{what} {p} cannot be written: {e.strerror or e}") from None
    return p


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output folder") -> Path:
    """``path`` as a folder this command may create or write into; UsageError otherwise (nothing is created)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        parent = p.resolve().parent
        while not parent.exists():  # created with parents: the first existing ancestor must be a writable folder
            parent = parent.parent
        _writable_folder(parent, what, p)
        return p
    except OSError as e:
        raise UsageError(f"{what} {p}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(
            f"{what} {p} is {'a file' if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)}: give a folder or a new path"
        )
    _not_kernel_files(p, f"{what} {p}")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {p} is not writable")
    return p
