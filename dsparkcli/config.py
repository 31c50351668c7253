"""Where dspark keeps things, and the user's config file (TOML)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tomllib

from dsparkcli.errors import UsageError


def cache_dir() -> Path:
    """User cache root (models from PyPI, tunings, logs, hash cache; engine builds unless
    ``DSPARK_ENGINE_DIR`` is set). ``DSPARK_CACHE_DIR`` overrides."""
    env = os.environ.get("DSPARK_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs  # deferred: the GPU scripts' torch-only python imports this module without it

    return Path(platformdirs.user_cache_dir("dspark"))


def engine_dir() -> Path:
    """Where llama.cpp builds live (``<dir>/<build key>``, their load tables in ``<dir>/tables``).
    ``DSPARK_ENGINE_DIR`` overrides, so the model cache and the engine can be set apart: an empty model
    cache (``DSPARK_CACHE_DIR``) with a built engine is what a new user's machine has after its first build."""
    env = os.environ.get("DSPARK_ENGINE_DIR")
    return Path(env) if env else cache_dir() / "engine"


def engine_source_dir() -> Path:
    """Where the pinned llama.cpp sources are unpacked: ``<DSPARK_ENGINE_DIR>/src`` when that is set, else
    ``<cache>/src`` (the layout before the setting existed: builds record their source path, and a build
    whose recorded source moved would be redone)."""
    env = os.environ.get("DSPARK_ENGINE_DIR")
    return Path(env) / "src" if env else cache_dir() / "src"


def config_dir() -> Path:
    env = os.environ.get("DSPARK_CONFIG_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_config_dir("dspark"))


def config_path() -> Path:
    return config_dir() / "config.toml"


def user_models_path() -> Path:
    """User registry entries, same schema as the repo's models.toml."""
    return config_dir() / "models.toml"


@dataclass(frozen=True)
class UserConfig:
    llama_bin: str | None = None  # [engine] llama_bin: a llama-server binary or the folder holding it


def load_config(path: Path | None = None) -> UserConfig:
    path = path or config_path()
    if not path.is_file():
        return UserConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {path} is not valid TOML: {e}") from e
    engine = data.get("engine", {})
    llama_bin = engine.get("llama_bin") if isinstance(engine, dict) else None
    if llama_bin is not None and not isinstance(llama_bin, str):
        raise UsageError(f"config file {path}: [engine] llama_bin must be a string")
    return UserConfig(llama_bin=llama_bin)
