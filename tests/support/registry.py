"""The user's registry layer (``<config dir>/models.toml``), written the one way tests do it."""

from __future__ import annotations

from pathlib import Path


def write_user_models(config_dir: Path, toml: str) -> Path:
    """Write ``toml`` as ``config_dir/models.toml``; returns ``config_dir`` (for DSPARK_CONFIG_DIR)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "models.toml").write_text(toml)
    return config_dir
