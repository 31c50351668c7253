"""``hf://owner/repo[@revision]/path/in/repo.gguf`` addresses: parsed in one place, without importing the hub client."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsparkcli.errors import UsageError


@dataclass(frozen=True)
class HubLocation:
    """One file on the hub, as written ``hf://owner/repo[@revision]/path/in/repo.gguf``."""

    repo: str
    filename: str
    revision: str


# The hub's own rule for repo ids (huggingface_hub.utils.validate_repo_id): letters, digits, '-', '_', '.';
# no '--' or '..'; '-' and '.' neither first nor last; 96 characters at most. Checked here, so a bad id is
# one line instead of the client's HFValidationError traceback.
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
MAX_REPO_ID = 96


def _bad(spec: str, why: str) -> UsageError:
    shown = "".join(c if c.isprintable() else "?" for c in spec)[:200]
    return UsageError(f"bad hub address '{shown}': {why}")


def parse_hf_uri(spec: str) -> HubLocation:
    rest = spec[len("hf://") :] if spec.startswith("hf://") else spec
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts):
        raise _bad(spec, "expected hf://owner/repo[@revision]/path.gguf")
    owner, repo_rev, path = parts[0], parts[1], "/".join(parts[2:])
    repo, _, revision = repo_rev.partition("@")
    for name in (owner, repo):
        if not _NAME.fullmatch(name) or "--" in name or ".." in name:
            raise _bad(spec, f"'{name[:40]}' is not a hub name (letters, digits, '-', '_', '.'; no '--' or '..')")
    if len(owner) + 1 + len(repo) > MAX_REPO_ID:
        raise _bad(spec, f"the repo id is longer than {MAX_REPO_ID} characters")
    if any(p in (".", "..") for p in parts[2:]):
        raise _bad(spec, "'.' and '..' are not allowed in the path")
    return HubLocation(f"{owner}/{repo}", path, revision or "main")
