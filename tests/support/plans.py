"""A lease plan of study/plans/ dry-run on the CPU engine (study.lease.dry_run), isolated for a test: its own
dspark cache and config (the tuning store and everything a leg writes there), the session's engine named by
DSPARK_LLAMA_BIN so the dry run builds nothing."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import REPO

PLANS = REPO / "study" / "plans"
EVAL = REPO / "tests" / "data" / "lease"


def dry_run_plan(name: str, engine, tmp_path: Path, monkeypatch) -> Path:  # type: ignore[no-untyped-def]
    """The folder the dry run imported (one sub-folder per leg); every leg of the plan finished (rc 0)."""
    from study import lease

    monkeypatch.setenv("DSPARK_LLAMA_BIN", str(engine.bin_dir))
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    plan = PLANS / f"{name}.toml"
    dest = lease.dry_run(tmp_path / "work", EVAL, plan=plan, results=tmp_path / "results")[0]
    log = json.loads((dest / "lease-log.json").read_text())
    _, legs = lease.load_plan(plan)
    ran = {leg["name"]: leg["rc"] for leg in log["legs"]}
    assert ran == {leg.name: 0 for leg in legs}, {n: (dest / n / "leg.log").read_text()[-2000:] for n in ran}
    return dest


def device_dir(tmp_path: Path) -> Path:
    """The dry run's stand-in for the GPU machine's lease dir (its known-answer pair is in pair/)."""
    return tmp_path / "work" / "device"
