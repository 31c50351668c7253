"""Fetch registry files from the Hugging Face hub and prove every byte.

Everything goes through huggingface_hub's HTTP stack (``HfApi.model_info`` for the listing, sizes,
LFS sha256 and commit; its shared session, auth headers and typed errors for the bytes), into the
standard HF cache layout (``models--org--name/{blobs,snapshots,refs}``) or a plain ``--dir``.

Why not ``hf_hub_download`` for the bytes: huggingface_hub 2.x writes to a per-process temporary
file and deletes it on any failure, so an interrupted 20 GB download starts again from zero, and it
hashes nothing. Here the partial file survives (``blobs/<sha256>.dspark.incomplete`` or
``<dir>/.cache/dspark/``), the next run resumes it with a Range request, and sha256 is computed in a
thread while the bytes arrive, so verification costs about nothing on top of the download.

Environment, read at call time: HF_HOME / HF_HUB_CACHE (cache), HF_TOKEN (auth, never printed),
HF_HUB_OFFLINE (no network: cached files only), HF_ENDPOINT (hub URL).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from dsparkcli.config import cache_dir as dspark_cache_dir
from dsparkcli.hfref import HubLocation, parse_hf_uri  # noqa: F401 - re-exported for callers
from dsparkcli.errors import DsparkError, HubError, UsageError, VerificationError
from dsparkcli.registry import ModelFile, ModelPair

CONFIRM_ABOVE_BYTES = 10**9  # ask before downloading more than 1 GB
_HASH_BLOCK = 8 * 1024 * 1024  # disk reads when hashing a file (or a resumed prefix)
_FEED_BLOCK = 1024 * 1024  # network bytes handed to the hashing thread at a time
_MAX_STALLED_ATTEMPTS = 5  # retries in a row that receive no byte before giving up
_MAX_ATTEMPTS = 100  # requests for one file in one run, whatever they deliver
_TRUE = {"1", "ON", "YES", "TRUE"}


# -- environment ------------------------------------------------------------------------------------


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


# -- data -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """What ``on_progress`` receives. kind: start | advance | verify | done."""

    kind: str
    role: str
    filename: str
    done: int = 0  # bytes downloaded (advance) or hashed (verify) so far, including a resumed prefix
    total: int = 0


@dataclass(frozen=True)
class PlannedFile:
    """A registry file resolved against the hub listing (or, offline, against the local copy)."""

    role: str
    key: str
    repo: str
    revision: str
    commit: str | None  # None offline when nothing is cached
    filename: str  # the glob resolved to one path
    size: int | None
    sha256: str | None  # expected content hash: pinned in the registry, else the hub's LFS sha256
    sha256_source: str  # registry | hub | "" (non-LFS file: verified by its git blob id instead)
    git_oid: str | None
    path: Path  # where the verified file lives (or will)
    local_dir: Path | None  # --dir, or None for the HF cache
    present: bool
    partial_bytes: int  # bytes of an interrupted download waiting to be resumed

    @property
    def to_download(self) -> int:
        return 0 if self.present or self.size is None else self.size - self.partial_bytes


@dataclass(frozen=True)
class FetchedFile:
    role: str
    key: str
    repo: str
    commit: str | None
    filename: str
    path: Path
    size: int
    sha256: str
    sha256_source: str
    action: str  # downloaded | resumed | verified (was present, hashed now) | present (verified before)
    bytes_downloaded: int
    bytes_hashed_from_disk: int  # 0 for a fresh download: the hash was computed from the stream
    seconds: float
    hash_wait_seconds: float  # time spent waiting for the hash after the last byte arrived


Confirm = Callable[[list[PlannedFile]], bool]
OnProgress = Callable[[Progress], None]


# -- public API -------------------------------------------------------------------------------------


def fetch_ref(
    spec: str,
    *,
    role: str = "file",
    local_dir: Path | str | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_progress: OnProgress | None = None,
) -> Path:
    """Download (or find cached) one ``hf://`` file, verified against the hub's LFS sha256."""
    loc = parse_hf_uri(spec)
    f = ModelFile(role=role, key=role, repo=loc.repo, revision=loc.revision, filename=loc.filename)
    local = Path(local_dir).expanduser() if local_dir is not None else None
    if is_offline():
        planned = [_plan_offline(f, spec, local)]
    else:
        commit, remote = _listing(f.repo, f.revision, f.filename or "")
        planned = [_plan_online(f, commit, remote, local)]
    _confirm_large(planned, spec, yes=yes, confirm=confirm)
    return fetch_planned(planned, spec, on_progress=on_progress)[0].path


def _confirm_large(planned: list[PlannedFile], what: str, *, yes: bool, confirm: Confirm | None) -> None:
    """Ask before downloading more than CONFIRM_ABOVE_BYTES; without a way to ask, refuse with a hint."""
    total = sum(p.to_download for p in planned)
    if total <= CONFIRM_ABOVE_BYTES or yes:
        return
    if confirm is None:
        raise UsageError(f"{what} needs {format_size(total)} of downloads; pass --yes to go ahead")
    if not confirm(planned):
        raise DsparkError(f"fetch of {what} cancelled; nothing was downloaded")


def ensure_files(
    pair: ModelPair,
    draft_key: str | None = None,
    *,
    local_dir: Path | str | None = None,
    revision: str | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_progress: OnProgress | None = None,
    roles: Collection[str] | None = None,
) -> dict[str, Path]:
    """role (target, mmproj, draft) -> verified local path, downloading what is missing.

    ``roles`` limits it to some files (e.g. no draft for plain decoding: nothing unused is downloaded).
    """
    fetched = fetch(
        pair, draft_key, local_dir=local_dir, revision=revision, yes=yes, confirm=confirm, on_progress=on_progress,
        roles=roles,
    )
    return {f.role: f.path for f in fetched}


def fetch(
    pair: ModelPair,
    draft_key: str | None = None,
    *,
    local_dir: Path | str | None = None,
    revision: str | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_progress: OnProgress | None = None,
    roles: Collection[str] | None = None,
) -> list[FetchedFile]:
    """Plan, confirm big downloads, download and verify. Raises HubError / VerificationError."""
    planned = plan(pair, draft_key, local_dir=local_dir, revision=revision, roles=roles)
    _confirm_large(planned, pair.name, yes=yes, confirm=confirm)
    return fetch_planned(planned, pair.name, on_progress=on_progress)


def fetch_planned(planned: list[PlannedFile], pair_name: str, *, on_progress: OnProgress | None = None) -> list[FetchedFile]:
    """Download what ``plan`` found missing and verify every file (present ones too, unless verified before)."""
    return [_fetch_one(p, pair_name, on_progress) for p in planned]


def plan(
    pair: ModelPair,
    draft_key: str | None = None,
    *,
    local_dir: Path | str | None = None,
    revision: str | None = None,
    roles: Collection[str] | None = None,
) -> list[PlannedFile]:
    """Resolve every file of the pair (globs, sizes, hashes, commit) and what is already local."""
    files = pair.files(draft_key)
    if roles is not None:
        files = {role: f for role, f in files.items() if role in roles}
    if revision is not None:
        repos = {f.repo for f in files.values()}
        if len(repos) > 1 and _is_commit(revision):
            raise UsageError(
                f"--revision {revision} is a commit, but {pair.name} spans {len(repos)} repos; "
                "pin per-file revisions in your models.toml instead"
            )
        files = {role: replace(f, revision=revision) for role, f in files.items()}
    local = Path(local_dir).expanduser() if local_dir is not None else None
    if is_offline():
        return [_plan_offline(f, pair.name, local) for f in files.values()]
    listings: dict[tuple[str, str], tuple[str, dict[str, _Remote]]] = {}
    planned = []
    for f in files.values():
        try:
            if (f.repo, f.revision) not in listings:
                listings[(f.repo, f.revision)] = _listing(f.repo, f.revision, f.filename or f.glob or "")
        except _Unreachable:
            # No network (but not declared offline): a cached copy still serves, as in huggingface_hub.
            if _find_local(f, local) is None:
                raise
            planned.append(_plan_offline(f, pair.name, local))
            continue
        commit, remote_files = listings[(f.repo, f.revision)]
        planned.append(_plan_online(f, commit, remote_files, local))
    return planned


def local_status(
    pair: ModelPair, draft_key: str | None = None, *, local_dir: Path | str | None = None
) -> dict[str, Path | None]:
    """role -> local path if the file is present (no network), else None."""
    local = Path(local_dir).expanduser() if local_dir is not None else None
    status: dict[str, Path | None] = {}
    for role, f in pair.files(draft_key).items():
        found = _find_local(f, local)
        status[role] = found[0] if found else None
    return status


def format_size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# -- planning ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Remote:
    path: str
    size: int | None
    sha256: str | None  # LFS sha256
    git_oid: str | None


def _is_commit(revision: str) -> bool:
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def _is_sha256(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _listing(repo: str, revision: str, what: str) -> tuple[str, dict[str, _Remote]]:
    """(commit, path -> remote file) for one repo revision: one model_info call with file metadata."""
    with _hub_errors(repo, revision, what):
        info = HfApi(endpoint=hf_endpoint()).model_info(repo, revision=revision, files_metadata=True)
    remote = {
        s.rfilename: _Remote(
            path=s.rfilename,
            size=s.lfs.size if s.lfs else s.size,
            sha256=s.lfs.sha256 if s.lfs else None,
            git_oid=s.blob_id,
        )
        for s in info.siblings or []
    }
    return str(info.sha), remote


def _match(f: ModelFile, names: list[str]) -> list[str]:
    if f.filename is not None:
        return [f.filename] if f.filename in names else []
    assert f.glob is not None
    # A glob without "/" matches file names at any depth, like `hf download --include`.
    return sorted(n for n in names if fnmatch.fnmatchcase(n, f.glob) or fnmatch.fnmatchcase(n.rsplit("/", 1)[-1], f.glob))


def _plan_online(f: ModelFile, commit: str, remote: dict[str, _Remote], local: Path | None) -> PlannedFile:
    matches = _match(f, list(remote))
    if not matches:
        if f.filename is not None:
            raise HubError(f"{f.filename} not found in {f.repo}@{f.revision} (404); check the registry entry")
        raise HubError(f"no file in {f.repo}@{f.revision} matches '{f.glob}'; set an exact filename in your models.toml")
    if len(matches) > 1:
        raise HubError(
            f"'{f.glob}' matches {len(matches)} files in {f.repo}@{f.revision} ({', '.join(matches[:4])}); "
            "set an exact filename in your models.toml"
        )
    r = remote[matches[0]]
    what = f"{r.path} ({f.repo})"
    if r.size is None:
        raise HubError(f"{what}: the hub listing gives no size, so the download cannot be checked")
    if f.size is not None and r.size is not None and f.size != r.size:
        raise VerificationError(
            f"{what}: the registry pins {f.size} bytes but the hub has {r.size}; the repo changed — "
            "pin --revision to the audited commit or update the registry entry"
        )
    if f.sha256 is not None and r.sha256 is not None and f.sha256 != r.sha256:
        raise VerificationError(
            f"{what}: the registry pins sha256 {f.sha256} but the hub reports {r.sha256}; the repo changed — "
            "pin --revision to the audited commit or update the registry entry"
        )
    sha256 = f.sha256 or r.sha256
    source = "registry" if f.sha256 else ("hub" if r.sha256 else "")
    size = f.size if f.size is not None else r.size
    if sha256 is None and r.git_oid is None:
        raise HubError(f"{what}: the hub gave neither an LFS sha256 nor a blob id, so it cannot be verified")
    path = _final_path(f.repo, commit, r.path, local)
    partial = _partial_path(f.repo, sha256 or r.git_oid or "", r.path, local)
    present = path.is_file() or _adopt_blob(f.repo, commit, r.path, sha256 or r.git_oid or "", local)
    return PlannedFile(
        role=f.role, key=f.key, repo=f.repo, revision=f.revision, commit=commit, filename=r.path, size=size,
        sha256=sha256, sha256_source=source, git_oid=r.git_oid, path=path, local_dir=local, present=present,
        partial_bytes=partial.stat().st_size if partial.is_file() and not present else 0,
    )  # fmt: skip


def _plan_offline(f: ModelFile, pair_name: str, local: Path | None) -> PlannedFile:
    found = _find_local(f, local)
    if found is None:
        where = f"in {local}" if local is not None else "in the HF cache"
        raise HubError(
            f"offline (HF_HUB_OFFLINE) and the {f.role} {f.pattern} of {pair_name} is not {where}; "
            f"run `dspark fetch {pair_name}{' --dir ' + str(local) if local else ''}` with network access first"
        )
    path, commit = found
    size = path.stat().st_size
    if f.size is not None and f.size != size:
        raise VerificationError(f"{path}: {size} bytes, the registry pins {f.size}; delete it and fetch again")
    # Offline there is no hub hash: the pinned one, else the one recorded when it was fetched.
    # huggingface_hub names LFS blobs by their sha256, so a cached blob carries its own expected hash.
    blob_name = Path(os.path.realpath(path)).name
    recorded = (_read_marker(path) or {}).get("sha256") or (blob_name if _is_sha256(blob_name) else None)
    sha256 = f.sha256 or recorded
    return PlannedFile(
        role=f.role, key=f.key, repo=f.repo, revision=f.revision, commit=commit,
        filename=str(path.relative_to(local)) if local is not None else path.name, size=size,
        sha256=sha256, sha256_source="registry" if f.sha256 else ("recorded" if sha256 else ""),
        git_oid=None, path=path, local_dir=local, present=True, partial_bytes=0,
    )  # fmt: skip


# -- local layout -----------------------------------------------------------------------------------


def _repo_folder(repo: str) -> Path:
    return hf_cache_dir() / ("models--" + repo.replace("/", "--"))


def _final_path(repo: str, commit: str, filename: str, local: Path | None) -> Path:
    if local is not None:
        return local / filename
    return _repo_folder(repo) / "snapshots" / commit / filename


def _partial_path(repo: str, content_id: str, filename: str, local: Path | None) -> Path:
    # Keyed by the expected content, so a resumed prefix always belongs to the same bytes.
    if local is not None:
        return local / ".cache" / "dspark" / f"{content_id}.incomplete"
    return _repo_folder(repo) / "blobs" / f"{content_id}.dspark.incomplete"


def _blob_path(repo: str, content_id: str) -> Path:
    return _repo_folder(repo) / "blobs" / content_id


def _adopt_blob(repo: str, commit: str, filename: str, content_id: str, local: Path | None) -> bool:
    """A blob of this content is cached (e.g. under another commit): link it into this snapshot."""
    blob = _blob_path(repo, content_id)
    if local is not None or not content_id or not blob.is_file():
        return False
    _link_snapshot(blob, _final_path(repo, commit, filename, None))
    return True


def _link_snapshot(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks (some Windows setups): huggingface_hub copies too
        shutil.copyfile(blob, pointer)


def _write_ref(repo: str, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = _repo_folder(repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text() != commit:
        ref.write_text(commit)


def _find_local(f: ModelFile, local: Path | None) -> tuple[Path, str | None] | None:
    """(path, commit) of the local copy of ``f`` without touching the network, or None."""
    if local is not None:
        root, commit = local, None
    else:
        folder = _repo_folder(f.repo)
        commit = f.revision if _is_commit(f.revision) else None
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
    matches = _match(f, names)
    return (root / matches[0], commit) if len(matches) == 1 else None


# -- verified markers: a file hashed once is not re-hashed while its size and mtime stay the same ----


def _marker_path(path: Path) -> Path:
    real = os.path.realpath(path)
    return dspark_cache_dir() / "verified" / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")


def _read_marker(path: Path) -> dict | None:
    try:
        data = json.loads(_marker_path(path).read_text())
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns:
        return data
    return None


def _write_marker(path: Path, sha256: str | None, git_oid: str | None) -> None:
    st = os.stat(path)
    marker = _marker_path(path)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        body = {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        body.update({"sha256": sha256} if sha256 else {"git_oid": git_oid})
        marker.write_text(json.dumps(body))
    except OSError:
        pass  # only an optimisation: the file gets hashed again next time


# -- hashing ----------------------------------------------------------------------------------------


class _Hasher:
    """sha256 (or git blob sha1) of a file being appended to, computed in a thread.

    The prefix already on disk (a resumed download) is read first; then the chunks the network
    delivers are hashed from memory as they arrive. hashlib releases the GIL, so this overlaps with
    the socket reads and the file writes instead of adding a second pass over the file afterwards.
    """

    def __init__(self, path: Path, prefix: int, *, git_size: int | None = None) -> None:
        self._h = hashlib.sha1(b"blob %d\0" % git_size) if git_size is not None else hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=32)
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._error: BaseException | None = None
        self.bytes_from_disk = 0
        self._thread = threading.Thread(target=self._run, args=(path, prefix), name="dspark-hash", daemon=True)
        self._thread.start()

    def _run(self, path: Path, prefix: int) -> None:
        try:
            if prefix:
                with open(path, "rb") as fh:
                    left = prefix
                    while left:
                        block = fh.read(min(_HASH_BLOCK, left))
                        if not block:
                            raise OSError(f"{path} shrank while being hashed")
                        self._h.update(block)
                        self.bytes_from_disk += len(block)
                        left -= len(block)
            while (chunk := self._queue.get()) is not None:
                self._h.update(chunk)
        except BaseException as e:  # noqa: BLE001 - handed to the caller in finish()
            self._error = e
            while self._queue.get() is not None:  # drain so the producer never blocks
                pass

    def feed(self, chunk: bytes) -> None:
        self._pending.append(chunk)
        self._pending_len += len(chunk)
        if self._pending_len >= _FEED_BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._queue.put(b"".join(self._pending))
            self._pending, self._pending_len = [], 0

    def finish(self) -> str:
        self._flush()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()

    def abandon(self) -> None:
        self._pending = []
        self._queue.put(None)
        self._thread.join()


def hash_file(path: Path, *, git_size: int | None = None, on_block: Callable[[int], None] | None = None) -> str:
    """sha256 of a whole file (git blob sha1 with ``git_size``), large sequential reads."""
    h = hashlib.sha1(b"blob %d\0" % git_size) if git_size is not None else hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
            done += len(block)
            if on_block:
                on_block(done)
    return h.hexdigest()


# -- downloading ------------------------------------------------------------------------------------


class _Unreachable(HubError):
    """The hub could not be reached at all (DNS, refused, timeout), as opposed to an HTTP error."""


@contextmanager
def _hub_errors(repo: str, revision: str, what: str, pair_name: str | None = None) -> Iterator[None]:
    """huggingface_hub / network exceptions -> one-line HubError."""
    endpoint = hf_endpoint()
    try:
        yield
    except GatedRepoError as e:
        status = e.response.status_code if e.response is not None else 401
        why = "no token was sent" if status == 401 else "the token has no access"
        raise HubError(
            f"{repo} is gated ({status}: {why}): accept its licence at {endpoint}/{repo} "
            "and set HF_TOKEN to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"repository {repo} not found on {endpoint} (404); if it is private, set HF_TOKEN"
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{revision}' not found in {repo} (404)") from None
    except RemoteEntryNotFoundError:
        raise HubError(f"{what} not found in {repo}@{revision} (404)") from None
    except OfflineModeIsEnabled:
        fetch_cmd = f"`dspark fetch {pair_name}`" if pair_name else "`dspark fetch`"
        raise HubError(f"offline (HF_HUB_OFFLINE) and {what} is not cached; run {fetch_cmd} with network access") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubError(f"the hub answered HTTP {status} for {what} in {repo}") from None
    except httpx2.HTTPError as e:
        raise _Unreachable(
            f"cannot reach {endpoint} for {repo} ({type(e).__name__}); check the network, "
            "or set HF_HUB_OFFLINE=1 to use cached files"
        ) from None


def _fetch_one(p: PlannedFile, pair_name: str, on_progress: OnProgress | None) -> FetchedFile:
    emit = on_progress or (lambda _event: None)
    t0 = time.monotonic()
    git_size = p.size if p.sha256 is None else None  # non-LFS: verify the git blob id
    expected = p.sha256 or p.git_oid
    if not p.present and p.commit is not None and expected is not None and (
        p.path.is_file() or _adopt_blob(p.repo, p.commit, p.filename, expected, p.local_dir)
    ):  # fetched since planning, e.g. the same file serves two roles
        p = replace(p, present=True, partial_bytes=0)
    if p.present:
        marker = _read_marker(p.path)
        if marker is not None and expected is not None and expected in (marker.get("sha256"), marker.get("git_oid")):
            emit(Progress("done", p.role, p.filename, p.size or 0, p.size or 0))
            return _fetched(p, expected, "present", 0, t0, 0.0, 0)
        if expected is None:
            raise VerificationError(
                f"{p.path}: no sha256 to check it against offline; fetch {pair_name} once with network access"
            )
        total = p.path.stat().st_size
        emit(Progress("verify", p.role, p.filename, 0, total))
        got = hash_file(p.path, git_size=git_size, on_block=lambda n: emit(Progress("verify", p.role, p.filename, n, total)))
        if got != expected:
            _remove_bad_local(p)
            raise VerificationError(
                f"{p.path} is corrupt: sha256 {got}, expected {expected} ({p.sha256_source or 'git blob id'}); "
                f"it was removed — run `dspark fetch {pair_name}` to download it again"
            )
        _write_marker(p.path, p.sha256, p.git_oid)
        emit(Progress("done", p.role, p.filename, total, total))
        return _fetched(p, expected, "verified", 0, t0, 0.0, total)

    assert p.commit is not None and p.size is not None and expected is not None
    partial = _partial_path(p.repo, expected, p.filename, p.local_dir)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _check_space(partial, p.size - p.partial_bytes, p)
    url = hf_hub_url(p.repo, p.filename, revision=p.commit, endpoint=hf_endpoint())
    resumed = p.partial_bytes > 0
    with _hub_errors(p.repo, p.commit, p.filename, pair_name):
        got, downloaded, hash_wait, from_disk = _download(url, partial, p, emit, git_size)
    if got != expected:
        partial.unlink(missing_ok=True)  # never keep (or resume) bytes that hash wrong
        raise VerificationError(
            f"{p.filename} from {p.repo}@{p.commit[:12]}: sha256 {got}, expected {expected} "
            f"({p.sha256_source or 'git blob id'}); the download was discarded — run `dspark fetch {pair_name}` "
            + (
                "again; if it repeats, the hub's file is not the audited one: pin --revision or update the registry"
                if p.sha256_source == "registry"
                else "again; if it repeats, the hub (or a proxy) serves bytes that do not match its own sha256"
            )
        )
    _install(partial, p)
    _write_marker(p.path, p.sha256, p.git_oid)
    emit(Progress("done", p.role, p.filename, p.size, p.size))
    return _fetched(p, expected, "resumed" if resumed else "downloaded", downloaded, t0, hash_wait, from_disk)


def _fetched(
    p: PlannedFile, digest: str, action: str, downloaded: int, t0: float, hash_wait: float, from_disk: int
) -> FetchedFile:
    return FetchedFile(
        role=p.role, key=p.key, repo=p.repo, commit=p.commit, filename=p.filename, path=p.path,
        size=p.path.stat().st_size, sha256=digest if p.sha256 else "", sha256_source=p.sha256_source,
        action=action, bytes_downloaded=downloaded, bytes_hashed_from_disk=from_disk, seconds=round(time.monotonic() - t0, 3),
        hash_wait_seconds=round(hash_wait, 4),
    )  # fmt: skip


def _check_space(partial: Path, needed: int, p: PlannedFile) -> None:
    free = shutil.disk_usage(partial.parent).free
    if needed > free:
        raise HubError(
            f"disk full: {p.filename} needs {format_size(needed)} more but {partial.parent} has "
            f"{format_size(free)} free; free space or pass --dir on a bigger disk"
        )


def _download(
    url: str, partial: Path, p: PlannedFile, emit: OnProgress, git_size: int | None
) -> tuple[str, int, float, int]:
    """Append the missing bytes of ``url`` to ``partial`` (resuming), hashing as they arrive.

    Returns (hex digest of the whole file, bytes received, seconds waited for the hash after the last
    byte, bytes the hash had to read back from disk: only a prefix left by an earlier run).
    A dropped connection resumes at once if it delivered bytes, with backoff if it did not.
    """
    assert p.size is not None
    headers = build_hf_headers()  # HF_TOKEN or the stored login; never logged
    received = 0
    stalled = 0
    for _attempt in range(_MAX_ATTEMPTS):
        have = partial.stat().st_size if partial.exists() else 0
        if have > p.size:  # not ours to trust: start over
            partial.unlink()
            have = 0
        hasher = _Hasher(partial, have, git_size=git_size)
        if have == p.size:  # complete from an earlier run; only the hash is missing
            t = time.monotonic()
            return hasher.finish(), received, time.monotonic() - t, hasher.bytes_from_disk
        emit(Progress("start", p.role, p.filename, have, p.size))
        try:
            _stream(url, headers, partial, have, p, hasher, emit)
        except _RangeIgnored:
            hasher.abandon()
            partial.unlink()  # the server sends the whole file: take it from byte 0
            continue
        except (httpx2.TransportError, _ShortBody) as e:
            hasher.abandon()
            progressed = _size(partial) > have
            received += _size(partial) - have
            stalled = 0 if progressed else stalled + 1
            if stalled >= _MAX_STALLED_ATTEMPTS:
                raise HubError(
                    f"download of {p.filename} keeps failing at {format_size(_size(partial))} of "
                    f"{format_size(p.size)} ({type(e).__name__}); the partial file is kept — run the "
                    "same command again to resume"
                ) from None
            if not progressed:
                time.sleep(min(2**stalled, 8))
            continue
        except OSError as e:
            hasher.abandon()
            if e.errno == 28:  # ENOSPC
                raise HubError(
                    f"disk full while writing {partial}; the partial download is kept — free space and "
                    "run the same command again to resume"
                ) from None
            raise
        except BaseException:
            hasher.abandon()  # Ctrl-C included: the partial stays for the next run
            raise
        received += p.size - have
        t = time.monotonic()
        return hasher.finish(), received, time.monotonic() - t, hasher.bytes_from_disk
    raise HubError(
        f"download of {p.filename} did not complete in {_MAX_ATTEMPTS} requests; the partial file is kept — "
        "run the same command again to resume"
    )


class _ShortBody(Exception):
    """The server ended a response early without an HTTP-level error."""


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _stream(url: str, headers: dict, partial: Path, have: int, p: PlannedFile, hasher: _Hasher, emit: OnProgress) -> None:
    """One GET (Range from ``have``) appended to ``partial``; raises if it ends before ``p.size``."""
    assert p.size is not None
    request_headers = {**headers, "Accept-Encoding": "identity"}
    if have:
        request_headers["Range"] = f"bytes={have}-"
    received = 0
    with http_stream_backoff(
        "GET", url, headers=request_headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
        retry_on_exceptions=(), retry_on_status_codes=(408, 429, 500, 502, 503, 504),
    ) as response:  # fmt: skip
        hf_raise_for_status(response)
        if have and response.status_code == 200:  # the server ignored Range
            raise _RangeIgnored()
        with open(partial, "ab") as fh:
            done = have
            for chunk in response.iter_bytes():  # as delivered: an interruption loses nothing written
                fh.write(chunk)
                hasher.feed(chunk)
                received += len(chunk)
                done += len(chunk)
                emit(Progress("advance", p.role, p.filename, done, p.size))
    if have + received > p.size:
        partial.unlink()
        raise VerificationError(
            f"{p.filename}: the hub sent {have + received} bytes, its listing says {p.size}; the download was "
            "discarded — run the same command again"
        )
    if have + received != p.size:
        raise _ShortBody(f"{have + received} of {p.size} bytes")


class _RangeIgnored(_ShortBody):
    pass


def _install(partial: Path, p: PlannedFile) -> None:
    """Move a verified download to its final place (atomic rename; the cache gets blob + link + ref)."""
    if p.local_dir is not None:
        p.path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, p.path)
        return
    assert p.commit is not None
    content_id = p.sha256 or p.git_oid or ""
    blob = _blob_path(p.repo, content_id)
    os.replace(partial, blob)
    _link_snapshot(blob, p.path)
    _write_ref(p.repo, p.revision, p.commit)


def _remove_bad_local(p: PlannedFile) -> None:
    real = Path(os.path.realpath(p.path))
    for path in {p.path, real}:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
