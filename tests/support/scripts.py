"""The study kit (study/ at the repo root) as modules (``study.<name>``, as ``python -m study.<name>`` runs them)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from support.cli import REPO


def script(name: str) -> ModuleType:
    if str(REPO) not in sys.path:  # pytest puts tests/ on sys.path, not always the repo root
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"study.{name}")


def run_script(
    name: str, *args: str, engine_dir: Path, cache: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m study.<name> ARGS`` from the repo root, on the given engine, with its own dspark cache."""
    env = {**os.environ, "DSPARK_CACHE_DIR": str(cache), "DSPARK_LLAMA_BIN": str(engine_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", f"study.{name}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
