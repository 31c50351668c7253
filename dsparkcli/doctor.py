"""What engine dspark will use and whether it can run DSpark: asked of the binary, not assumed."""

from __future__ import annotations

from dataclasses import dataclass

from dsparkcli.llama import engine as eng_mod
from dsparkcli.llama.engine import Capabilities, Engine


@dataclass(frozen=True)
class DoctorReport:
    server: str
    found_via: str
    version: str
    commit: str
    backend: str
    devices: tuple[str, ...]
    capabilities: Capabilities
    ok: bool  # draft-dspark available
    problems: tuple[str, ...]


def diagnose(llama_bin: str | None = None) -> DoctorReport:
    engine: Engine = eng_mod.describe(eng_mod.resolve_engine(llama_bin))
    caps = eng_mod.capabilities(engine)
    devices = tuple(eng_mod.list_devices(engine))
    problems = []
    if not caps.draft_dspark:
        problems.append(f"no 'draft-dspark' in --spec-type: {eng_mod.BUILD_HINT}")
    if not caps.mmproj:
        problems.append("no --mmproj: vision models cannot be served")
    if not caps.spec_synth_len:
        problems.append("no --spec-synth-len: `dspark bench --synth-len` unavailable")
    return DoctorReport(
        server=str(engine.server), found_via=engine.source, version=engine.version, commit=engine.commit,
        backend=engine.backend, devices=devices, capabilities=caps, ok=caps.draft_dspark, problems=tuple(problems),
    )
