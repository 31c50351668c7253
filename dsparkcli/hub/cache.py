"""The HF cache layout and dspark's "verified" markers, without the network.

Files live where huggingface_hub puts them (``models--org--name/{blobs,snapshots,refs}``) or in a plain
``--dir``; a partial download is keyed by its expected content hash so a resumed prefix always belongs to
the same bytes. Environment (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT) is read at call time.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

from huggingface_hub import constants

from dsparkcli.config import cache_dir as dspark_cache_dir
from dsparkcli.hub.model_file import ModelFile

_TRUE = {"1", "ON", "YES", "TRUE"}


def hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hf_cache_dir() -> Path:
    """The HF hub cache, resolved like huggingface_hub does but at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    return Path(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.HF_HUB_OFFLINE or env.upper() in _TRUE


def is_commit(revision: str) -> bool:
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def is_sha256(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def match_names(f: ModelFile, names: list[str]) -> list[str]:
    if f.filename is not None:
        return [f.filename] if f.filename in names else []
    assert f.glob is not None
    # A glob without "/" matches file names at any depth, like `hf download --include`.
    return sorted(
        n for n in names if fnmatch.fnmatchcase(n, f.glob) or fnmatch.fnmatchcase(n.rsplit("/", 1)[-1], f.glob)
    )


def repo_folder(repo: str) -> Path:
    return hf_cache_dir() / ("models--" + repo.replace("/", "--"))


def final_path(repo: str, commit: str, filename: str, local: Path | None) -> Path:
    if local is not None:
        return local / filename
    return repo_folder(repo) / "snapshots" / commit / filename


def partial_path(repo: str, content_id: str, filename: str, local: Path | None) -> Path:
    # Keyed by the expected content, so a resumed prefix always belongs to the same bytes.
    if local is not None:
        return local / ".cache" / "dspark" / f"{content_id}.incomplete"
    return repo_folder(repo) / "blobs" / f"{content_id}.dspark.incomplete"


def blob_path(repo: str, content_id: str) -> Path:
    return repo_folder(repo) / "blobs" / content_id


def adopt_blob(repo: str, commit: str, filename: str, content_id: str, local: Path | None) -> bool:
    """A blob of this content is cached (e.g. under another commit): link it into this snapshot."""
    blob = blob_path(repo, content_id)
    if local is not None or not content_id or not blob.is_file():
        return False
    link_snapshot(blob, final_path(repo, commit, filename, None))
    return True


def link_snapshot(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks (some Windows setups): huggingface_hub copies too
        shutil.copyfile(blob, pointer)


def write_ref(repo: str, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo_folder(repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text() != commit:
        ref.write_text(commit)


def find_local(f: ModelFile, local: Path | None) -> tuple[Path, str | None] | None:
    """(path, commit) of the local copy of ``f`` without touching the network, or None."""
    if local is not None:
        root, commit = local, None
    else:
        folder = repo_folder(f.repo)
        commit = f.revision if is_commit(f.revision) else None
        ref = folder / "refs" / f.revision
        if commit is None and ref.is_file():
            commit = ref.read_text().strip()
        if commit is None:
            return None
        root = folder / "snapshots" / commit
    if not root.is_dir():
        return None
    if f.filename is not None:
        path = root / f.filename
        return (path, commit) if path.is_file() else None
    assert f.glob is not None
    names = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".cache" not in p.relative_to(root).parts
    )
    matches = match_names(f, names)
    return (root / matches[0], commit) if len(matches) == 1 else None


def marker_path(path: Path) -> Path:
    real = os.path.realpath(path)
    return dspark_cache_dir() / "verified" / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")


def read_marker(path: Path) -> dict | None:
    try:
        data = json.loads(marker_path(path).read_text())
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns:
        return data
    return None


def write_marker(path: Path, sha256: str | None, git_oid: str | None) -> None:
    st = os.stat(path)
    marker = marker_path(path)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        body = {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        body.update({"sha256": sha256} if sha256 else {"git_oid": git_oid})
        marker.write_text(json.dumps(body))
    except OSError:
        pass  # only an optimisation: the file gets hashed again next time
