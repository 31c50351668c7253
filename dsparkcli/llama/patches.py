"""dspark's patch series for llama.cpp: unified diffs shipped in ``dsparkcli/data/patches`` (applied in
name order), applied by ``dspark engine build`` to a COPY of the pinned tree, never to the cached source.

The series' hash is part of the engine's cache key, so a stock build (``--no-patches``) and a patched
one live side by side. Applying is strict: every hunk's old lines must match the tree exactly (at the
recorded line, or at one unique place elsewhere in the file: a user's ``--source`` tree may have moved
code); anything else fails in one line before a compiler starts. No ``patch`` or ``git`` needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import EngineBuildError

PATCH_DIR = Path(__file__).resolve().parent.parent / "data" / "patches"
# each llama.cpp base the series was made for, and its folder: b11312's at the top (its file names are in
# engine records), a later base's in a folder of its own with a BASE file (the release and tree it was
# rebased onto, from ``git format-patch --base``). The same patch keeps its file name in every folder;
# b11549's adds 0009 (MiniCPM-V 4.7: projector minicpmv4_7, rope.section_order), which b11312's lacks.
SERIES_DIRS = {"b11312": PATCH_DIR, "b11549": PATCH_DIR / "b11549"}
# the release the default engine is built from (llama.sources.SDISTS holds the sdist that vendors it);
# b11312 (0c1e570, llama-cpp-python's sdist) stays buildable with --sdist llama-cpp-python
DEFAULT_BASE = "b11549"
MARKER = ".dspark-patches"  # in a patched copy: the series hash it was made with (written last)

_SWITCH_RE = re.compile(r"\b(DSPARK_[A-Z0-9_]+)=1\b")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Patch:
    name: str
    text: str

    @property
    def summary(self) -> str:
        """The patch's subject line (format-patch's ``Subject:``, else its first line)."""
        lines = self.text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Subject:"):
                while i + 1 < len(lines) and lines[i + 1].startswith(" "):  # a folded header line
                    i += 1
                    line += lines[i]
                return re.sub(r"^Subject:\s*(\[PATCH[^\]]*\]\s*)?", "", line).strip()
        return self.text.splitlines()[0].strip() if self.text.strip() else self.name

    @property
    def description(self) -> str:
        """The text before the first file header (format-patch's message)."""
        head, _, _ = self.text.partition("\ndiff --git ")
        return head.partition("\n--- ")[0]

    @property
    def off_switch(self) -> str | None:
        """The environment variable that turns this patch's change off in a build that has it (its
        description says ``NAME=1``), so one build measures it on and off; None: it has none."""
        m = _SWITCH_RE.search(self.description)
        return m.group(1) if m else None

    @property
    def number(self) -> str:
        """The series position in the file name ("0006")."""
        return self.name.split("-", 1)[0]


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based
    old: tuple[str, ...]  # lines without their newline
    new: tuple[str, ...]


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the tree
    hunks: tuple[Hunk, ...]
    create: bool = False


def shipped(directory: Path | None = None) -> tuple[Patch, ...]:
    """The series shipped with dspark for the default base (or the one in ``directory``), in the order it
    is applied (by file name)."""
    directory = directory or SERIES_DIRS[DEFAULT_BASE]
    if not directory.is_dir():
        return ()
    return tuple(Patch(p.name, p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.patch")))


def series_for(release: str) -> tuple[Patch, ...] | None:
    """dspark's series for a llama.cpp release; None: it has none for that base (the tree builds stock)."""
    directory = SERIES_DIRS.get(release)
    return shipped(directory) if directory is not None else None


@dataclass(frozen=True)
class Base:
    """A series' BASE file: the upstream release, its commit ("" unknown), the sdist it was taken from, the
    git tree hash of the pristine tree (``git write-tree`` of it, every file, as unpacked), and the base
    commit the series was generated on."""

    release: str
    commit: str
    source: str
    tree: str
    base_commit: str = ""  # the commit of that tree the series was generated from (``format-patch --base``)
    message: str = ""  # that commit's message (with its fixed author and date, the commit is reproducible)


def base_of(directory: Path) -> Base | None:
    """The BASE file beside a series (``key: value`` lines); None where there is none."""
    path = directory / "BASE"
    if not path.is_file():
        return None
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in path.read_text().splitlines()) if v
    )
    return Base(
        fields.get("release", ""),
        fields.get("commit", ""),
        fields.get("source", ""),
        fields.get("tree", ""),
        fields.get("base-commit", ""),
        fields.get("message", ""),
    )


def switches_off(patch_names: tuple[str, ...] | list[str], environ: dict[str, str] | None = None) -> list[str]:
    """Which of these shipped patches the environment turns off (``NUMBER (VAR=value)`` each): llama-server
    inherits dspark's environment, so a switch set there is off in every server dspark starts. The
    engine tests only that the variable exists (``getenv(...) != nullptr``), so "0" or "" turn it off too."""
    environ = os.environ if environ is None else environ
    by_name = {p.name: p for p in shipped()}
    return [
        f"{p.number} ({p.off_switch}={environ[p.off_switch]})"
        for n in patch_names
        if (p := by_name.get(n)) is not None and p.off_switch and p.off_switch in environ
    ]


def off_switch(number: str) -> str:
    """The off switch of the shipped patch ``number`` ("0004"); a patch without one is a caller's bug."""
    sw = next((p.off_switch for p in shipped() if p.number == number), None)
    if sw is None:
        raise KeyError(f"shipped patch {number} has no off switch")
    return sw


@contextlib.contextmanager
def switched_off(numbers: Iterable[str]) -> Iterator[None]:
    """These shipped patches off in every llama-server started inside the block (they inherit dspark's
    environment), and only these: the other switches are cleared for the block; all restored after."""
    every = [p.off_switch for p in shipped() if p.off_switch]
    want = {off_switch(n) for n in numbers}
    saved = {v: os.environ.get(v) for v in every}
    try:
        for v in every:
            if v in want:
                os.environ[v] = "1"
            else:
                os.environ.pop(v, None)
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


def series_hash(patches: tuple[Patch, ...]) -> str:
    """8 hex digits over the names and texts in order ("" for no patches): the engine cache key's part."""
    if not patches:
        return ""
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.text.encode() + b"\0")
    return h.hexdigest()[:8]


def parse(patch: Patch) -> tuple[FileDiff, ...]:
    """The file diffs of a unified (git) diff; text before the first ``---`` header is its description."""
    lines = patch.text.splitlines()
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_name, new_name = lines[i][4:].split("\t")[0], lines[i + 1][4:].split("\t")[0]
        create = old_name == "/dev/null"
        if new_name == "/dev/null":
            raise EngineBuildError(f"patch {patch.name} deletes {old_name}: not supported")
        path = new_name[2:] if new_name.startswith("b/") else new_name
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (m := _HUNK_RE.match(lines[i])):
            n_old = int(m.group(2)) if m.group(2) is not None else 1
            n_new = int(m.group(4)) if m.group(4) is not None else 1
            old: list[str] = []
            new: list[str] = []
            i += 1
            while len(old) < n_old or len(new) < n_new:
                if i >= len(lines):
                    raise EngineBuildError(f"patch {patch.name} is truncated in {path}")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if tag == " " or line == "":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                elif tag != "\\":  # "\ No newline at end of file": the tree keeps its own ending
                    raise EngineBuildError(f"patch {patch.name} has a malformed hunk in {path}: {line[:40]!r}")
                i += 1
            hunks.append(Hunk(int(m.group(1)), tuple(old), tuple(new)))
        if not hunks:
            raise EngineBuildError(f"patch {patch.name} has no hunks for {path}")
        files.append(FileDiff(path, tuple(hunks), create))
    if not files:
        raise EngineBuildError(f"patch {patch.name} changes no file")
    return tuple(files)


def _find(lines: list[str], block: tuple[str, ...], expected: int) -> int:
    """Where ``block`` starts in ``lines``: at ``expected`` if it matches there, else its one other place."""
    n = len(block)
    if lines[expected : expected + n] == list(block):
        return expected
    hits = [j for j in range(len(lines) - n + 1) if lines[j : j + n] == list(block)]
    return hits[0] if len(hits) == 1 else -1


def apply(tree: Path, patch: Patch) -> list[str]:
    """Apply one patch to ``tree`` (a copy): files rewritten whole through a temporary file; nothing
    is written unless every hunk of every file matches. Returns the changed paths."""
    tree = tree.resolve()
    results: list[tuple[Path, str]] = []
    for fd in parse(patch):
        target = (tree / fd.path).resolve()
        if tree not in target.parents:
            raise EngineBuildError(f"patch {patch.name} names a path outside the tree: {fd.path}")
        if fd.create:
            if target.exists():
                raise EngineBuildError(f"patch {patch.name} creates {fd.path}, which already exists")
            lines: list[str] = []
        elif not target.is_file():
            raise EngineBuildError(f"patch {patch.name} does not apply: {fd.path} is not in {tree}")
        else:
            lines = target.read_text(encoding="utf-8").split("\n")
        shift = 0
        for n, h in enumerate(fd.hunks, 1):
            # "-5,0": insert after line 5; otherwise the old lines start at line old_start
            expected = h.old_start + shift if not h.old else h.old_start - 1 + shift
            at = _find(lines, h.old, max(0, expected)) if h.old else min(max(0, expected), len(lines))
            if at < 0:
                raise EngineBuildError(
                    f"patch {patch.name} does not apply to {fd.path} (hunk {n} at line {h.old_start})",
                    hint="the tree is not the one the series was made for (try --no-patches)",
                )
            lines[at : at + len(h.old)] = list(h.new)
            # later hunks' lines moved by this hunk's growth and by where it was found
            shift = at + len(h.new) - (h.old_start - 1 + len(h.old)) if h.old else at + len(h.new) - h.old_start
        text = "\n".join(lines)
        if fd.create and not text.endswith("\n"):
            text += "\n"
        results.append((target, text))
    for target, text in results:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".dspark-tmp")
        tmp.write_text(text, encoding="utf-8")
        if target.exists():
            shutil.copymode(target, tmp)
        os.replace(tmp, target)  # a new inode: a hard link to the pristine tree would stay pristine
    return [str(t.relative_to(tree)) for t, _ in results]


def patched_copy(source: Path, dest: Path, patches: tuple[Patch, ...]) -> Path:
    """``dest``: a copy of ``source`` with the series applied, made once per series (``MARKER`` holds its
    hash and is written last, so an interrupted copy is redone). The source tree is only read."""
    want = series_hash(patches)
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == want:
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        # .git: a submodule's pointer file whose relative path would not resolve from the copy
        shutil.copytree(source, partial, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        for p in patches:
            apply(partial, p)
        (partial / MARKER).write_text(want + "\n")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest
