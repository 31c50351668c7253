"""What engine dspark will use, whether it can run DSpark and what it can load: asked of the binary (and
the tree it was built from), not assumed."""

from __future__ import annotations

from dataclasses import dataclass

from dsparkcli.llama import engine as eng_mod
from dsparkcli.llama.engine import Capabilities, Engine
from dsparkcli.llama.loads import engine_tables
from dsparkcli.llama.tables import EngineTables


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
    loads: EngineTables | None = None  # the archs, projector types and tensor types it can load


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
    loads = engine_tables(engine)
    if loads is None:
        problems.append("no arch/projector/type tables found in its source tree or libraries: files are not "
                        "checked before download or launch")
    return DoctorReport(
        server=str(engine.server), found_via=engine.source, version=engine.version, commit=engine.commit,
        backend=engine.backend, devices=devices, capabilities=caps, ok=caps.draft_dspark, problems=tuple(problems),
        loads=loads,
    )
