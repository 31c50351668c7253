"""Shared fixtures. Integration tests use the real llama.cpp engine that `make engine` builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsparkcli import engine as engine_mod
from dsparkcli.engine import Engine

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real llama-server build. A missing engine is a failure, not a skip: `make test` builds it."""
    return engine_mod.describe(engine_mod.resolve_engine())


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `dspark ...` in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "dsparkcli.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=input)


@pytest.fixture
def cli():
    return run_cli
