"""Resumable, hashed HTTP downloads from the hub, and the one translation of hub errors into HubError.

The partial file survives any failure; the next call resumes it with a Range request, and sha256 (or
the git blob id) is computed in a thread while the bytes arrive, so verification costs about nothing.
"""

from __future__ import annotations

import hashlib
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dsparkcli.errors import HubError, VerificationError
from dsparkcli.hub.cache import hf_endpoint
from dsparkcli.units import format_size


class Transfer(Protocol):
    """What a download needs to know about its file (``fetch.PlannedFile`` is one)."""

    role: str
    filename: str
    size: int | None


_HASH_BLOCK = 8 * 1024 * 1024  # disk reads when hashing a file (or a resumed prefix)


_FEED_BLOCK = 1024 * 1024  # network bytes handed to the hashing thread at a time


_MAX_STALLED_ATTEMPTS = 5  # retries in a row that receive no byte before giving up


_MAX_ATTEMPTS = 100  # requests for one file in one run, whatever they deliver


@dataclass(frozen=True)
class Progress:
    """What ``on_progress`` receives. kind: start | advance | verify | done."""

    kind: str
    role: str
    filename: str
    done: int = 0  # bytes downloaded (advance) or hashed (verify) so far, including a resumed prefix
    total: int = 0


OnProgress = Callable[[Progress], None]


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


class Unreachable(HubError):
    """The hub could not be reached at all (DNS, refused, timeout), as opposed to an HTTP error.

    ``missing`` names the file that is not cached either: HF_HUB_OFFLINE=1 would not help then, so the
    line does not suggest it (following it only led to a second refusal)."""

    def __init__(self, endpoint: str, repo: str, cause: str, *, missing: str | None = None) -> None:
        head = f"cannot reach {endpoint} for {repo} ({cause})"
        if missing is None:
            super().__init__(f"{head}; check the network, or set HF_HUB_OFFLINE=1 to use cached files")
        else:
            super().__init__(f"{head} and the {missing} is not cached; check the network")
        self.endpoint, self.repo, self.cause = endpoint, repo, cause


class NotCached(HubError):
    """Offline (HF_HUB_OFFLINE) and a file the hub holds is not here."""


@contextmanager
def hub_errors(repo: str, revision: str, what: str, pair_name: str | None = None) -> Iterator[None]:
    """huggingface_hub / network exceptions -> one-line HubError."""
    # deferred (as every huggingface_hub / httpx2 import of the hub wing): ~0.2 s that only commands
    # which reach the hub pay for
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

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
        raise HubError(f"repository {repo} not found on {endpoint} (404); if it is private, set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{revision}' not found in {repo} (404)") from None
    except RemoteEntryNotFoundError:
        raise HubError(f"{what} not found in {repo}@{revision} (404)") from None
    except OfflineModeIsEnabled:
        fetch_cmd = f"`dspark fetch {pair_name}`" if pair_name else "`dspark fetch`"
        raise NotCached(
            f"offline (HF_HUB_OFFLINE) and {what} is not cached; run {fetch_cmd} with network access"
        ) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubError(f"the hub answered HTTP {status} for {what} in {repo}") from None
    except httpx2.HTTPError as e:
        raise Unreachable(endpoint, repo, type(e).__name__) from None


def check_space(partial: Path, needed: int, p: Transfer) -> None:
    free = shutil.disk_usage(partial.parent).free
    if needed > free:
        raise HubError(
            f"disk full: {p.filename} needs {format_size(needed)} more but {partial.parent} has "
            f"{format_size(free)} free; free space or pass --dir on a bigger disk"
        )


def download(
    url: str, partial: Path, p: Transfer, emit: OnProgress, git_size: int | None
) -> tuple[str, int, float, int]:
    """Append the missing bytes of ``url`` to ``partial`` (resuming), hashing as they arrive.

    Returns (hex digest of the whole file, bytes received, seconds waited for the hash after the last
    byte, bytes the hash had to read back from disk: only a prefix left by an earlier run).
    A dropped connection resumes at once if it delivered bytes, with backoff if it did not.
    """
    import httpx2
    from huggingface_hub.utils import build_hf_headers

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
            progressed = _file_size(partial) > have
            received += _file_size(partial) - have
            stalled = 0 if progressed else stalled + 1
            if stalled >= _MAX_STALLED_ATTEMPTS:
                raise HubError(
                    f"download of {p.filename} keeps failing at {format_size(_file_size(partial))} of "
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
            if _file_size(partial) == 0:  # unless it holds nothing: an empty file is no download kept
                partial.unlink(missing_ok=True)
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


def _file_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _stream(url: str, headers: dict, partial: Path, have: int, p: Transfer, hasher: _Hasher, emit: OnProgress) -> None:
    """One GET (Range from ``have``) appended to ``partial``; raises if it ends before ``p.size``."""
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

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
