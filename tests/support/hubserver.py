"""A local stand-in for the Hugging Face Hub, for tests that run the REAL huggingface_hub client.

It serves small in-memory repos the way huggingface.co does for the endpoints huggingface_hub
(2.x) calls: ``hf_hub_download``/``get_hf_file_metadata`` (HEAD/GET ``/{repo}/resolve/{rev}/{path}``
with X-Repo-Commit, ETag, X-Linked-Etag = LFS sha256, X-Linked-Size, Range -> 206), ``model_info``
(``/api/models/{repo}/revision/{rev}``, ``?blobs=true`` adds size/blobId/lfs), ``list_repo_tree``
(``/api/models/{repo}/tree/{rev}[/{path}]``) and ``get_paths_info`` (POST ``paths-info``), which is
what ``HfFileSystem`` (hf://) needs too. Errors carry the hub's ``X-Error-Code`` so the client raises
its own typed errors (GatedRepoError, RepositoryNotFoundError, RemoteEntryNotFoundError, ...).

    with FakeHub() as hub:
        hub.add_file("org/repo", "model.gguf", data)
        hf_hub_download("org/repo", "model.gguf", endpoint=hub.endpoint, cache_dir=tmp)
        hub.bytes_served, hub.requests

Fault knobs (all take effect on the next request):
    hub.gate(repo_id, allowed_tokens=())     file bytes (resolve) answer 401 without a token and 403 with a
                                             token not allowed (X-Error-Code: GatedRepo); the API stays
                                             readable, as on the hub
    hub.corrupt(repo_id, path)               serve wrong bytes (same length, same headers)
    hub.cut_next(repo_id, path, offset)      the next GET of that file drops the connection after
                                             the byte at absolute ``offset`` (queue: one per call)
    hub.advertise_size(repo_id, path, n)     claim ``n`` bytes in metadata (X-Linked-Size, listings)
    hub.throttle_bytes_per_s = n             pace file bodies like a link of that speed (None: full speed)
Only 127.0.0.1, port 0. Tokens are never recorded: ``requests`` keeps only whether one was sent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the hub reports as ETag/oid for non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Request:
    """One request as the server saw it (no header values that could hold secrets)."""

    method: str
    path: str  # URL path, unquoted
    range: str | None  # the Range header, if any
    status: int
    authorized: bool  # an Authorization header was sent (its value is never kept)


@dataclass
class _Blob:
    data: bytes
    lfs: bool
    sha256: str
    git_oid: str


@dataclass
class _Revision:
    files: dict[str, _Blob] = field(default_factory=dict)
    commit: str = ""


class FakeHub:
    """Context manager running the fake hub on 127.0.0.1 in a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: dict[str, dict[str, _Revision]] = {}
        self._gated: dict[str, frozenset[str]] = {}
        self._corrupt: set[tuple[str, str]] = set()
        self._cuts: dict[tuple[str, str], deque[int]] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        self.requests: list[Request] = []
        self.bytes_served = 0  # body bytes sent for resolve GETs (file content)
        self.throttle_bytes_per_s: float | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- content -------------------------------------------------------------------------------

    def add_file(self, repo_id: str, path: str, data: bytes, revision: str = "main", lfs: bool = True) -> str:
        """Add (or replace) a file; returns its sha256. Each call is a new commit on ``revision``."""
        blob = _Blob(data=data, lfs=lfs, sha256=hashlib.sha256(data).hexdigest(), git_oid=git_blob_sha1(data))
        with self._lock:
            rev = self._repos.setdefault(repo_id, {}).setdefault(revision, _Revision())
            rev.files[path] = blob
            listing = "".join(f"{p}:{b.git_oid};" for p, b in sorted(rev.files.items()))
            rev.commit = hashlib.sha1(f"{repo_id}@{revision}:{listing}".encode()).hexdigest()
        return blob.sha256

    def commit(self, repo_id: str, revision: str = "main") -> str:
        return self._repos[repo_id][revision].commit

    def url(self, repo_id: str, path: str, revision: str = "main") -> str:
        return f"{self.endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    # -- faults --------------------------------------------------------------------------------

    def gate(self, repo_id: str, allowed_tokens: tuple[str, ...] = ()) -> None:
        self._gated[repo_id] = frozenset(allowed_tokens)

    def corrupt(self, repo_id: str, path: str, on: bool = True) -> None:
        (self._corrupt.add if on else self._corrupt.discard)((repo_id, path))

    def cut_next(self, repo_id: str, path: str, offset: int) -> None:
        self._cuts.setdefault((repo_id, path), deque()).append(offset)

    def advertise_size(self, repo_id: str, path: str, size: int) -> None:
        self._sizes[(repo_id, path)] = size

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "FakeHub is not running (use it as a context manager)"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def client_env(self, hf_home: object) -> dict[str, str]:
        """What a dspark run needs to use this hub and nothing else: its endpoint, a fresh HF_HOME, online,
        no telemetry and no token of the user's."""
        return {
            "HF_HOME": str(hf_home),
            "HF_ENDPOINT": self.endpoint,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": "",
        }

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # polled every 20 ms, not the default 0.5 s: shutdown() waits for the next poll, at every test's end
        serve = functools.partial(self._server.serve_forever, poll_interval=0.02)
        self._thread = threading.Thread(target=serve, name="fakehub", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- lookups used by the handler -----------------------------------------------------------

    def _split_repo(self, rest: str) -> tuple[str, str] | None:
        """'org/name/xyz' -> ('org/name', 'xyz') for a known repo (longest match), else None."""
        for repo_id in sorted(self._repos, key=len, reverse=True):
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return repo_id, rest[len(repo_id) + 1 :]
        return None

    def _revision(self, repo_id: str, revision: str) -> _Revision | None:
        revs = self._repos[repo_id]
        if revision in revs:
            return revs[revision]
        for rev in revs.values():  # a commit sha works as a revision too
            if rev.commit == revision:
                return rev
        return None

    def _size(self, repo_id: str, path: str, blob: _Blob) -> int:
        return self._sizes.get((repo_id, path), len(blob.data))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the body, written after the headers, would otherwise wait for the client's delayed ACK
    # (~40 ms a response on Linux loopback; 5 of the 100-download test's 6 s)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # keep test output clean

    # -- plumbing --------------------------------------------------------------------------------

    def _record(self, status: int, path: str) -> None:
        with self.fake._lock:
            self.fake.requests.append(
                Request(
                    method=self.command,
                    path=path,
                    range=self.headers.get("Range"),
                    status=status,
                    authorized=bool(self.headers.get("Authorization")),
                )
            )

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, path: str = "") -> None:
        self._record(status, path)
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, path: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        self._send(status, body, headers, path)

    def _json(self, obj: object, path: str) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, path)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.startswith("Bearer ") else None

    def _access_denied(self, repo_id: str, path: str) -> bool:
        """Send the hub's gated-repo answer if the caller may not read ``repo_id``."""
        allowed = self.fake._gated.get(repo_id)
        if allowed is None:
            return False
        token = self._token()
        if token is not None and token in allowed:
            return False
        status = 401 if token is None else 403
        message = (
            f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it."
            if token is None
            else f"Access to model {repo_id} is restricted and you are not in the authorized list."
        )
        self._error(status, "GatedRepo", message, path)
        return True

    def _resolve_repo(self, rest: str, path: str) -> tuple[str, str] | None:
        found = self.fake._split_repo(rest)
        if found is None:
            # The hub answers 401 to anonymous callers for unknown (or private) repos, 404 otherwise.
            status = 404 if self._token() else 401
            self._error(status, "RepoNotFound", "Repository not found", path)
            return None
        return found

    # -- routes ----------------------------------------------------------------------------------

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch()

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._post_body = self.rfile.read(length) if length else b""
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            if split.path.startswith("/api/models/"):
                self._api(split.path[len("/api/models/") :], query, path)
            elif "/resolve/" in split.path:
                self._resolve(split.path.lstrip("/"), path)
            else:
                self._error(404, "NotFound", "Not found", path)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (e.g. an interrupted download): nothing to answer

    def _api(self, raw: str, query: dict[str, str], path: str) -> None:
        found = self._resolve_repo(raw, path)  # repo ids are plain ASCII; revisions may hold %2F
        if found is None:
            return
        repo_id, tail = found
        parts = tail.split("/", 2) if tail else []
        if not parts:
            return self._model_info(repo_id, "main", query, path)
        kind = parts[0]
        revision = unquote(parts[1]) if len(parts) > 1 else "main"
        rev = self.fake._revision(repo_id, revision)
        if rev is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", path)
        if kind == "revision":
            return self._model_info(repo_id, revision, query, path)
        if kind == "tree":
            sub = unquote(parts[2]) if len(parts) > 2 else ""
            return self._tree(repo_id, rev, sub, query.get("recursive", "False").lower() == "true", path)
        if kind == "paths-info" and self.command == "POST":
            form = parse_qs(self._post_body.decode())
            wanted = form.get("paths", [])
            entries = [e for e in self._entries(repo_id, rev, "", recursive=True) if e["path"] in wanted]
            return self._json(entries, path)
        self._error(404, "NotFound", "Not found", path)

    def _file_entry(self, repo_id: str, file_path: str, blob: _Blob) -> dict:
        size = self.fake._size(repo_id, file_path, blob)
        entry: dict = {"type": "file", "oid": blob.git_oid, "size": size, "path": file_path}
        if blob.lfs:
            entry["lfs"] = {"oid": blob.sha256, "size": size, "pointerSize": 134}
        return entry

    def _entries(self, repo_id: str, rev: _Revision, sub: str, recursive: bool) -> list[dict]:
        prefix = sub.rstrip("/") + "/" if sub else ""
        files, dirs = [], set()
        for file_path, blob in sorted(rev.files.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix) :]
            parents = rest.split("/")[:-1]
            for depth in range(1, len(parents) + 1):
                if recursive or depth == 1:
                    dirs.add(prefix + "/".join(parents[:depth]))
            if recursive or not parents:
                files.append(self._file_entry(repo_id, file_path, blob))
        folders = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
            for d in sorted(dirs)
        ]
        return folders + files

    def _tree(self, repo_id: str, rev: _Revision, sub: str, recursive: bool, path: str) -> None:
        if sub and not any(p == sub or p.startswith(sub.rstrip("/") + "/") for p in rev.files):
            return self._error(404, "EntryNotFound", f"{sub} does not exist on this revision", path)
        self._json(self._entries(repo_id, rev, sub, recursive), path)

    def _model_info(self, repo_id: str, revision: str, query: dict[str, str], path: str) -> None:
        rev = self.fake._revision(repo_id, revision)
        if rev is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", path)
        blobs = query.get("blobs", "").lower() == "true"
        siblings = []
        for file_path, blob in sorted(rev.files.items()):
            sibling: dict = {"rfilename": file_path}
            if blobs:
                size = self.fake._size(repo_id, file_path, blob)
                sibling.update(size=size, blobId=blob.git_oid)
                if blob.lfs:
                    sibling["lfs"] = {"size": size, "sha256": blob.sha256, "pointerSize": 134}
            siblings.append(sibling)
        info = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": rev.commit,
            "private": False,
            "gated": "manual" if repo_id in self.fake._gated else False,
            "disabled": False,
            "tags": ["gguf"],
            "downloads": 0,
            "likes": 0,
            "siblings": siblings,
        }
        self._json(info, path)

    def _resolve(self, raw: str, path: str) -> None:
        found = self._resolve_repo(raw, path)
        if found is None or self._access_denied(found[0], path):  # like the hub, only file bytes are gated
            return
        repo_id = found[0]
        rest = raw[raw.index("/resolve/") + len("/resolve/") :]
        revision_raw, _, file_raw = rest.partition("/")
        revision, file_path = unquote(revision_raw), unquote(file_raw)
        rev = self.fake._revision(repo_id, revision)
        if rev is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", path)
        blob = rev.files.get(file_path)
        if blob is None:
            return self._error(404, "EntryNotFound", "Entry not found", path)

        data = blob.data
        if (repo_id, file_path) in self.fake._corrupt:
            data = bytes(b ^ 0x5A for b in data)  # same length, different bytes
        total = self.fake._size(repo_id, file_path, blob)
        headers = {
            "X-Repo-Commit": rev.commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{file_path.rsplit("/", 1)[-1]}"',
        }
        if blob.lfs:
            # For LFS files the hub's ETag and X-Linked-Etag are the sha256 of the content.
            headers.update(
                {"ETag": f'"{blob.sha256}"', "X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(total)}
            )
        else:
            headers["ETag"] = f'"{blob.git_oid}"'

        start, end, status = 0, len(data) - 1, 200
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, len(data))
            if parsed is None:
                headers["Content-Range"] = f"bytes */{len(data)}"
                return self._send(416, b"", headers, path)
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start : end + 1]

        cut = None
        if self.command == "GET":
            queue = self.fake._cuts.get((repo_id, file_path))
            if queue:
                cut = queue.popleft()
        self._record(status, path)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut is not None and start <= cut < end:
            body = body[: cut - start + 1]
            self.close_connection = True  # the client sees a short body: a dropped connection
        rate = self.fake.throttle_bytes_per_s
        if rate:
            started, step = time.monotonic(), 256 * 1024
            for sent in range(0, len(body), step):
                self._write_counted(body[sent : sent + step])
                ahead = started + (sent + step) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        else:
            self._write_counted(body)
        self.wfile.flush()

    def _write_counted(self, chunk: bytes) -> None:
        # Counted before the write, not after: once the bytes are on the socket the client can finish
        # and the test can read bytes_served before this thread runs again (a CI run saw exactly that).
        with self.fake._lock:
            self.fake.bytes_served += len(chunk)
        self.wfile.write(chunk)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A client that drops a keep-alive connection (every cut download does) is not an error of the
        # fake hub; anything else still prints its traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """'bytes=a-b' | 'bytes=a-' | 'bytes=-n' -> inclusive (start, end), or None if unsatisfiable."""
    if not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    try:
        if first == "":
            n = int(last)
            start, end = max(size - n, 0), size - 1
        else:
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
    except ValueError:
        return None
    if start >= size or start > end:
        return None
    return start, end
