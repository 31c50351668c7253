"""The repo's scripts/ as modules (``scripts.<name>``, as ``python -m scripts.<name>`` runs them)."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from support.cli import REPO


def script(name: str) -> ModuleType:
    if str(REPO) not in sys.path:  # pytest puts tests/ on sys.path, not always the repo root
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"scripts.{name}")
