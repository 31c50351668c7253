"""What engine dspark will use, whether it can run DSpark and what it can load: asked of the binary (and
the tree it was built from), not assumed."""

from __future__ import annotations

from dataclasses import dataclass

from dsparkcli.llama import engine as eng_mod
from dsparkcli.llama import patches as patches_mod
from dsparkcli.llama import sources
from dsparkcli.llama.engine import Capabilities, Engine
from dsparkcli.llama.loads import build_record, engine_tables
from dsparkcli.llama.server import KEEP_LOGS, default_log_dir
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
    # dspark's patch series in this build (file names; None: not a dspark build, so unknown) and its hash
    patches: tuple[str, ...] | None = None
    patch_hash: str = ""
    release: str = ""  # upstream's release of the tree it was built from ("" = unknown)
    # where the logs of the servers dspark starts go, and how many are kept (older ones are deleted)
    log_dir: str = ""
    logs_kept: int = 0


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
    if not caps.adaptive_budget:
        problems.append(
            "no --spec-cost-table: --budget adaptive unavailable (a stock llama.cpp; dspark engine build "
            "applies dspark's patches)"
        )
    found = build_record(engine)
    loads = engine_tables(engine)
    if loads is None:
        problems.append(
            "no arch/projector/type tables found in its source tree or libraries: files are not "
            "checked before download or launch"
        )
    return DoctorReport(
        server=str(engine.server),
        found_via=engine.source,
        version=engine.version,
        commit=engine.commit,
        backend=engine.backend,
        devices=devices,
        capabilities=caps,
        ok=caps.draft_dspark,
        problems=tuple(problems),
        loads=loads,
        patches=tuple(found[1].patches) if found else None,
        patch_hash=found[1].patch_hash if found else "",
        release=(found[1].release if found else "")
        or sources.release_of(engine.commit or (found[1].commit if found else "")),
        log_dir=str(default_log_dir()),
        logs_kept=KEEP_LOGS,
    )


def upstream_line(report: DoctorReport) -> str:
    """Which upstream llama.cpp the engine is: its release and commit ("llama.cpp b11312 (0c1e570)")."""
    commit = report.commit or next((s.commit for s in sources.SDISTS if s.release == report.release), "")
    if not report.release:
        return f"llama.cpp {commit or '?'} (release unknown)"
    return f"llama.cpp {report.release} ({commit or 'commit unknown'})"


def patch_line(report: DoctorReport) -> str:
    """The doctor's one line about dspark's patch series in this engine."""
    current = patches_mod.series_hash(patches_mod.shipped())
    if report.patches is None:
        return "unknown (not a dspark build): capabilities below are read from --help"
    if not report.patches:
        return "none (stock llama.cpp)"
    if report.release and report.release != patches_mod.DEFAULT_BASE:
        series = patches_mod.series_for(report.release)
        current = patches_mod.series_hash(series) if series else current
    note = "" if report.patch_hash == current else f" (this dspark ships {current}: dspark engine build to update)"
    off = patches_mod.switches_off(report.patches)
    if off:
        note += f"; turned off by the environment: {', '.join(off)}"
    return f"{report.patch_hash}: {', '.join(report.patches)}{note}"
