"""``dspark tune --apply``: a tuning's overall choice as the user's models.toml override of a registry pair
(a table of only budget / p_min, which the registry lays over the packaged pair)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dsparkcli import config
from dsparkcli.budget.model import Choice
from dsparkcli.errors import UsageError

APPLY_MARK = "# dspark tune --apply"


def apply_to_models(name: str, choice: Choice, key_id: str, path: Path | None = None) -> Path:
    """Write the choice as the user's models.toml override of pair ``name`` (a table of only budget/p_min,
    which the registry lays over the packaged pair). A block this function wrote before is replaced; a
    table the user wrote is left alone (one-line error: edit it by hand). Written atomically."""
    if choice.candidate is None:
        raise UsageError(f"plain decoding beat every budget for {name}: nothing to apply (run with --no-draft)")
    path = path or config.user_models_path()
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    headers = (f'[pairs."{name}"]', f"[pairs.{name}]", f"[pairs.'{name}']")
    lines = text.splitlines()
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(APPLY_MARK) and i + 1 < len(lines) and lines[i + 1].strip() in headers:
            i += 2  # our earlier block: drop it up to the next table or mark
            while i < len(lines) and not lines[i].startswith("[") and not lines[i].startswith(APPLY_MARK):
                i += 1
            continue
        if line.strip() in headers or line.strip().startswith(tuple(h[:-1] + "." for h in headers)):
            raise UsageError(
                f"{path} already defines pair {name}: set budget = {choice.candidate.budget} there "
                "by hand (dspark only replaces blocks it wrote)"
            )
        kept.append(line)
        i += 1
    while kept and not kept[-1].strip():
        kept.pop()
    c = choice.candidate
    block = [
        f"{APPLY_MARK} (tuning {key_id}, category {choice.category}): this machine, engine and flags",
        f'[pairs."{name}"]',
        f"budget = {c.budget}",
    ]
    if c.p_min:
        block.append(f"p_min = {c.p_min:g}")
    body = "\n".join([*kept, "", *block] if kept else block) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".models.", suffix=".toml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, path)
    return path
