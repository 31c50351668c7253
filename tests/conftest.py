"""Shared fixtures. Integration tests use the real llama.cpp engine that `make engine` builds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import run_cli
from support.registry import write_user_models

from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.engine import Engine


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real llama-server build. A missing engine is a failure, not a skip: `make test` builds it."""
    return engine_mod.describe(engine_mod.resolve_engine())


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def user_models(tmp_path: Path) -> Callable[[str], Path]:
    """``user_models(TOML)`` writes the user's models.toml into ``<tmp>/cfg`` and returns that folder, for
    DSPARK_CONFIG_DIR: the one registry fixture (every test that adds pairs goes through it)."""
    return lambda toml: write_user_models(tmp_path / "cfg", toml)
