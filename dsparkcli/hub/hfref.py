"""``hf://owner/repo[@revision]/path/in/repo.gguf`` addresses: parsed in one place, without importing the hub client."""

from __future__ import annotations

from dataclasses import dataclass

from dsparkcli.errors import UsageError


@dataclass(frozen=True)
class HubLocation:
    """One file on the hub, as written ``hf://owner/repo[@revision]/path/in/repo.gguf``."""

    repo: str
    filename: str
    revision: str


def parse_hf_uri(spec: str) -> HubLocation:
    rest = spec[len("hf://") :] if spec.startswith("hf://") else spec
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts):
        shown = "".join(c if c.isprintable() else "?" for c in spec)[:200]
        raise UsageError(f"bad hub address '{shown}': expected hf://owner/repo[@revision]/path.gguf")
    owner, repo_rev, path = parts[0], parts[1], "/".join(parts[2:])
    repo, _, revision = repo_rev.partition("@")
    return HubLocation(f"{owner}/{repo}", path, revision or "main")
