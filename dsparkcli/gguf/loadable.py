"""Can the engine load this file? ``check_loads``: its arch (an mmproj: its projector types) and every tensor
type against the engine's own tables, FP4 weights on a build without native FP4 as advice; cached per file
version (``check_file_loads``); ``refuse_unloadable``: the one line that stops a launch. ``PairCheck`` is the
one check record, these and ``gguf.pairing``'s alike.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import EngineCapabilityError, GGUFError
from dsparkcli.gguf.analysis import printable, role_of, str_of
from dsparkcli.gguf.reader import GGUFHeader, read_header
from dsparkcli.llama.tables import EngineTables


@dataclass(frozen=True)
class PairCheck:
    name: str
    ok: bool | None  # None: could not be checked, or advice (shown, but does not fail the pair)
    detail: str
    file: str = ""  # the file a check is about, where that is one file (the engine checks)
    role: str = ""  # whose fit it checks against the target: target | draft | mmproj ("" for engine checks)


ENGINE_CHECK = "engine: "  # the prefix of every check against the engine in use
FP4_TYPES = {39: "MXFP4", 40: "NVFP4"}


def projector_types(h: GGUFHeader) -> tuple[str, ...]:
    """The projector types mtmd looks up, as clip.cpp reads them: ``clip.projector_type``, else one per
    encoder the file has (vision, audio)."""
    common = str_of(h.get("clip.projector_type"))
    if common:
        return (common,)
    found = []
    for modality in ("vision", "audio"):
        if h.get(f"clip.has_{modality}_encoder") or h.get(f"clip.{modality}.projector_type") is not None:
            found.append(str_of(h.get(f"clip.{modality}.projector_type")) or "")
    return tuple(found)


def _types_text(groups: dict[tuple[int, str], int]) -> str:
    return ", ".join(f"{printable(name, 20)} x{n}" for (_, name), n in sorted(groups.items(), key=lambda g: -g[1]))


def check_loads(h: GGUFHeader, tables: EngineTables) -> tuple[PairCheck, ...]:
    """Can the engine load this file: its arch (or, for an mmproj, its projector types) and every tensor
    type in the engine's own tables. FP4 weights on a build without native FP4 get advice, not a failure:
    they load and run, slower."""
    role = role_of(h)
    base = h.name.rsplit("/", 1)[-1]
    checks: list[PairCheck] = []
    if role == "mmproj":
        ptypes = projector_types(h)
        if not ptypes:
            checks.append(
                PairCheck(
                    f"{ENGINE_CHECK}{role} projector",
                    False,
                    "no clip.projector_type in the header: mtmd cannot tell what it is",
                    base,
                )
            )
        for ptype in ptypes:
            ok = bool(ptype) and tables.knows_projector(ptype)
            checks.append(
                PairCheck(
                    f"{ENGINE_CHECK}{role} projector",
                    ok,
                    f"projector type '{printable(ptype, 40)}' "
                    + ("is" if ok else "is not")
                    + f" in the engine's projector table "
                    f"({len(tables.projectors)} names)",
                    base,
                )
            )
    else:
        ok = bool(h.arch) and tables.knows_arch(h.arch)
        checks.append(
            PairCheck(
                f"{ENGINE_CHECK}{role} arch",
                ok,
                f"arch '{printable(h.arch or '?', 40)}' "
                + ("is" if ok else "is not")
                + f" in the engine's arch table ({len(tables.archs)} names)",
                base,
            )
        )
    groups: dict[tuple[int, str], int] = {}
    for t in h.tensors:
        groups[(t.type_id, t.type_name)] = groups.get((t.type_id, t.type_name), 0) + 1
    verdicts = {g: tables.knows_type(*g) for g in groups}
    missing = {g: n for g, n in groups.items() if verdicts[g] is False}
    unsure = {g: n for g, n in groups.items() if verdicts[g] is None}
    if missing:
        checks.append(
            PairCheck(
                f"{ENGINE_CHECK}{role} tensor types",
                False,
                f"{_types_text(missing)} not in the engine's ggml type table ({len(tables.tensor_types)} types)",
                base,
            )
        )
    elif unsure:
        checks.append(
            PairCheck(
                f"{ENGINE_CHECK}{role} tensor types",
                None,
                f"{_types_text(unsure)}: dspark has no "
                "name for these type ids, so the engine's libraries cannot be asked",
                base,
            )
        )
    else:
        checks.append(
            PairCheck(
                f"{ENGINE_CHECK}{role} tensor types",
                True,
                f"{_types_text(groups) or 'no tensors'}: all in the engine's type table",
                base,
            )
        )
    fp4 = sum(n for (tid, _), n in groups.items() if tid in FP4_TYPES)
    if fp4 and tables.native_fp4() is False:
        checks.append(
            PairCheck(
                f"{ENGINE_CHECK}{role} FP4 speed",
                None,
                f"{fp4} FP4 tensors, but this CUDA build "
                f"(sm_{tables.cuda_arch or '?'}) has no native FP4 path (ggml-cuda has one for "
                "sm_120/121 only): they load and run slower; on this GPU use a Q8_0/Q6_K/Q4_K GGUF "
                "instead" + (" (the registry's drafts: --draft q8_0 or q6_k)" if role == "draft" else ""),
                base,
            )
        )
    return tuple(checks)


@functools.lru_cache(maxsize=64)
def _file_loads(path: str, size: int, mtime_ns: int, tables: EngineTables) -> tuple[PairCheck, ...]:
    return check_loads(read_header(Path(path)), tables)


def check_file_loads(path: str | os.PathLike[str], tables: EngineTables) -> tuple[PairCheck, ...]:
    """``check_loads`` of a local file, worked out once per file version and engine: a real target's
    header (a 248k-token tokenizer) takes most of a second to read, and bench starts a server per arm."""
    st = Path(path).stat()
    return _file_loads(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, tables)


def readable_load_checks(paths: Sequence[str | os.PathLike[str]], tables: EngineTables) -> list[PairCheck]:
    """``check_file_loads`` of each file whose header dspark can read (llama.cpp reports the others)."""
    checks: list[PairCheck] = []
    for path in paths:
        try:
            checks.extend(check_file_loads(path, tables))
        except GGUFError:
            continue
    return checks


def refuse_unloadable(
    checks: Sequence[PairCheck], tables: EngineTables, engine: str, *, after: str = "", build: str = ""
) -> None:
    """One line naming what the engine cannot load and how to get one that can (``build``: the command the
    pair's registry entry names for it; ``after``: one more way on)."""
    failed = [c for c in checks if c.name.startswith(ENGINE_CHECK) and c.ok is False]
    if not failed:
        return
    what = "; ".join(f"{printable(c.file, 80)}: {c.detail}" for c in failed)
    if build:
        how = f"build one that can: {build}"
    elif tables.origin == "source":
        how = "build a newer one: dspark engine build --source <llama.cpp checkout that has it>"
    else:
        how = (
            "use a newer llama.cpp: --llama-bin <its build/bin>, or dspark engine build --source "
            "<llama.cpp checkout that has it>"
        )
    raise EngineCapabilityError(f"the engine {engine} cannot load {what}", hint=how + (f"; {after}" if after else ""))
