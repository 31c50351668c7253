"""GGUF headers of hub files without downloading them: HTTP range requests through huggingface_hub's
session (its auth headers, its typed errors), header bytes only.
"""

from __future__ import annotations

import dataclasses
import os
from urllib.parse import urlsplit

from dsparkcli.errors import GGUFError
from dsparkcli.gguf.pairing import open_header
from dsparkcli.gguf.reader import GGUFHeader, read_header
from dsparkcli.hub.cache import hf_endpoint
from dsparkcli.hub.download import hub_errors
from dsparkcli.hub.hfref import HubLocation, parse_hf_uri


class HubRangeSource:
    """A hub file read by HTTP range requests through huggingface_hub's session (header bytes only)."""

    def __init__(self, loc: HubLocation, endpoint: str | None = None) -> None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url  # deferred: see hub.download.hub_errors

        self.loc = loc
        self.name = f"hf://{loc.repo}/{loc.filename}"
        self.endpoint = endpoint or hf_endpoint()
        self.url = hf_hub_url(loc.repo, loc.filename, revision=loc.revision, endpoint=self.endpoint)
        with hub_errors(loc.repo, loc.revision, self.name):
            meta = get_hf_file_metadata(self.url, endpoint=self.endpoint)
        if meta.size is None:
            raise GGUFError(f"{self.name}: the hub did not report a size")
        self.size = int(meta.size)
        etag = (meta.etag or "").strip('"')
        self.sha256 = etag if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag) else None
        self.location = meta.location or self.url
        self.bytes_fetched = 0
        self.requests = 0

    def read_at(self, offset: int, n: int) -> bytes:
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        if n <= 0:
            return b""
        same_host = urlsplit(self.location).netloc == urlsplit(self.endpoint).netloc
        # the token goes to the hub only, never to the CDN a resolve URL redirects to
        headers = {**(build_hf_headers() if same_host else {}), "Range": f"bytes={offset}-{offset + n - 1}"}
        chunks: list[bytes] = []
        got = 0
        with (
            hub_errors(self.loc.repo, self.loc.revision, self.name),
            get_session().stream("GET", self.location, headers=headers, follow_redirects=True, timeout=60) as resp,
        ):
            hf_raise_for_status(resp)
            skip = offset if resp.status_code == 200 else 0  # a server that ignores Range: stop early anyway
            for chunk in resp.iter_bytes():
                if skip:
                    drop = min(skip, len(chunk))
                    chunk, skip = chunk[drop:], skip - drop
                chunks.append(chunk)
                got += len(chunk)
                if got >= n:
                    break
        self.requests += 1
        data = b"".join(chunks)[:n]
        self.bytes_fetched += len(data)
        return data


def read_gguf(spec: str | os.PathLike[str] | GGUFHeader, *, endpoint: str | None = None) -> GGUFHeader:
    """A header from a local path or an hf:// address (never the tensor data)."""
    if isinstance(spec, GGUFHeader):
        return spec
    text = str(spec)
    if text.startswith("hf://"):
        src = HubRangeSource(parse_hf_uri(text), endpoint)
        return dataclasses.replace(read_header(src), remote_sha256=src.sha256)
    return open_header(text)
