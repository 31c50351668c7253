"""What a llama.cpp engine can load, by name: its model archs, mtmd projector types and ggml tensor types.

Two ways to know, and they do not know the same:

- From the source tree an engine was built from (dspark's own builds record it): the three name
  tables themselves (``LLM_ARCH_NAMES`` in src/llama-arch.cpp, ``PROJECTOR_TYPE_NAMES`` in
  tools/mtmd/clip-impl.h, the ``ggml_type`` enum in ggml/include/ggml.h with the traits table in
  ggml/src/ggml.c). Exact: these are the tables the loaders look names up in.
- From a user's binary: the NUL-terminated strings of its shared libraries (libllama, libmtmd,
  libggml-base, or llama-server itself when statically linked). A name that is not among them is not in
  the table, so the engine cannot load it: that answer is certain. A name that is among them may be
  there for another reason (a tokenizer type spelled like an arch), and a type's number is not in the
  strings, so a type dspark cannot name is not checked. The listing shown is the names found from
  what dspark knows (its own tables and the runs of table strings around them); ``knows_*`` looks
  up any other name in the strings themselves.

Neither says whether a kernel is fast on a given GPU (NVFP4 runs natively only on sm_120/121 builds).
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1  # bump when what is recorded changes: cached tables of another format are recomputed

# where each table lives, relative to the llama.cpp tree
ARCH_SOURCE = "src/llama-arch.cpp"
PROJECTOR_SOURCE = "tools/mtmd/clip-impl.h"
TYPE_ENUM_SOURCE = "ggml/include/ggml.h"
TYPE_TRAITS_SOURCE = "ggml/src/ggml.c"

# the shared library (name prefix) that holds each table
LIBRARIES = {"archs": "libllama", "projectors": "libmtmd", "tensor_types": "libggml-base"}

# Names in every llama.cpp of the last years (0c1e570's tables hold them all): in a binary they find the
# run of the table's strings; any other name is looked up by itself.
ANCHORS = {
    "archs": frozenset(
        {
            "llama",
            "llama4",
            "falcon",
            "gpt2",
            "qwen2",
            "qwen3",
            "qwen3moe",
            "phi3",
            "gemma",
            "gemma2",
            "gemma3",
            "mamba",
            "deepseek2",
            "olmo",
            "t5",
        }
    ),
    "projectors": frozenset(
        {
            "mlp",
            "ldp",
            "ldpv2",
            "resampler",
            "adapter",
            "qwen2vl_merger",
            "qwen2.5vl_merger",
            "gemma3",
            "idefics3",
            "pixtral",
            "ultravox",
            "internvl",
            "llama4",
        }
    ),
}


@dataclass(frozen=True)
class EngineTables:
    """Names the engine's loaders accept. ``origin``: "source" (exact) or "libraries" (strings of the binary)."""

    archs: tuple[str, ...]
    projectors: tuple[str, ...]
    tensor_types: tuple[str, ...]  # ggml type names as gguf-py spells them: Q8_0, NVFP4
    tensor_type_ids: tuple[int, ...]  # the ids of those names (from the enum; for libraries, dspark's own table)
    origin: str
    where: str  # the source tree or the folder of the libraries
    backend: str = ""  # cpu | cuda
    cuda_arch: str = ""  # as built (e.g. "90", "120"); "" when unknown
    format: int = FORMAT
    libraries: tuple[tuple[str, str], ...] = ()  # origin "libraries": (table, the library read); a tuple keeps
    # the tables hashable, so checks of the same file against the same engine are worked out once

    def _has(self, table: str, listed: tuple[str, ...], name: str) -> bool:
        if name in listed:
            return True
        lib = dict(self.libraries).get(table) if self.origin == "libraries" else None
        if lib is None:
            return False
        try:  # a name dspark does not list: look it up in the library itself (a few ms)
            data = Path(lib).read_bytes()
            return any(in_binary(data, n) for n in _spellings(table, name))
        except OSError:
            return False

    def knows_arch(self, name: str) -> bool:
        return self._has("archs", self.archs, name)

    def knows_projector(self, name: str) -> bool:
        return self._has("projectors", self.projectors, name)

    def knows_type(self, type_id: int, name: str) -> bool | None:
        """Does the loader accept this tensor type? None: cannot tell (a type dspark has no name for,
        in an engine known only from its libraries)."""
        if self.origin == "source":
            return type_id in self.tensor_type_ids
        if name.startswith("type#"):
            return None
        return self._has("tensor_types", self.tensor_types, name)

    def native_fp4(self) -> bool | None:
        """Does this build run FP4 weights (NVFP4, MXFP4) on FP4 tensor cores? ggml-cuda does only for
        compiled archs 1200..1299 (blackwell_mma_available): sm_120/121, not sm_100 or Hopper. None: unknown."""
        if self.backend != "cuda":
            return None
        archs = [int(a) for a in re.findall(r"\d+", self.cuda_arch)]
        return any(120 <= a < 130 for a in archs) if archs else None


# ------------------------------------------------------------------ from the source tree


class TablesNotFound(Exception):
    """The tree or the libraries do not hold the tables where dspark looks (another layout)."""


def _read(root: Path, rel: str) -> str:
    path = root / rel
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise TablesNotFound(f"{path}: {e.strerror or e}") from e


def _block(text: str, opener: str, where: str) -> str:
    """The body of ``opener ... = { ... };`` (the first ``};`` after it closes the table)."""
    start = text.find(opener)
    if start < 0:
        raise TablesNotFound(f"no {opener} in {where}")
    end = text.find("};", start)
    return text[start : end if end > 0 else len(text)]


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def from_source(root: Path) -> EngineTables:
    """The three tables, read from a llama.cpp tree."""
    root = Path(root)
    archs = re.findall(
        r'\{\s*LLM_ARCH_(?!UNKNOWN\b)\w+\s*,\s*"([^"]+)"\s*\}',
        _block(_read(root, ARCH_SOURCE), "LLM_ARCH_NAMES", ARCH_SOURCE),
    )
    projectors = re.findall(
        r'\{\s*PROJECTOR_TYPE_\w+\s*,\s*"([^"]+)"\s*\}',
        _block(_read(root, PROJECTOR_SOURCE), "PROJECTOR_TYPE_NAMES", PROJECTOR_SOURCE),
    )
    enum = _strip_comments(_block(_read(root, TYPE_ENUM_SOURCE), "enum ggml_type", TYPE_ENUM_SOURCE))
    ids = {m.group(1): int(m.group(2)) for m in re.finditer(r"\bGGML_TYPE_(\w+)\s*=\s*(\d+)", enum)}
    ids.pop("COUNT", None)
    traits = _block(_read(root, TYPE_TRAITS_SOURCE), "type_traits[GGML_TYPE_COUNT]", TYPE_TRAITS_SOURCE)
    # gguf's loader refuses a type whose block size is 0 (the removed ones keep a traits entry with 0)
    entries = dict(re.findall(r"\[GGML_TYPE_(\w+)\]\s*=\s*\{([^{}]*)\}", traits))
    loadable = sorted(
        (tid, name)
        for name, tid in ids.items()
        if name in entries and not re.search(r"\.blck_size\s*=\s*0\s*,", entries[name])
    )
    if not archs or not projectors or not loadable:
        raise TablesNotFound(
            f"empty table in {root} (archs {len(archs)}, projectors {len(projectors)}, types {len(loadable)})"
        )
    return EngineTables(
        archs=tuple(archs),
        projectors=tuple(projectors),
        tensor_types=tuple(n for _, n in loadable),
        tensor_type_ids=tuple(t for t, _ in loadable),
        origin="source",
        where=str(root),
    )


# ------------------------------------------------------------------ from the shared libraries

# a run of NUL-terminated name-shaped strings: how a compiler lays out one table's literals
_RUN_RE = re.compile(rb"(?:[a-z0-9][a-zA-Z0-9_.\-]{0,39}\0+){8,}")


def library_for(bin_dir: Path, prefix: str) -> Path | None:
    """``<prefix>.so`` (any version suffix; .dylib on macOS) next to the binary or in ../lib."""
    for folder in (bin_dir, bin_dir.parent / "lib", bin_dir.parent / "lib64"):
        for pattern in (f"{prefix}.so", f"{prefix}.so.*", f"{prefix}.dylib", f"{prefix}.*.dylib"):
            found = sorted(p for p in folder.glob(pattern) if p.is_file())
            if found:
                return found[0].resolve()
    return None


def in_binary(data: bytes, name: str) -> bool:
    """Is ``name`` a C string of this binary? The linker merges a string into the tail of a longer one
    ("bert" into "modern-bert"), so a table's name is sure to appear as ``name\0``, not as ``\0name\0``."""
    return bool(name) and (name.encode("utf-8", "replace") + b"\0") in data


def _runs(data: bytes, anchors: frozenset[str]) -> list[str]:
    """The strings of every run that holds at least three anchors (dspark's own names for the table)."""
    found: list[str] = []
    for m in _RUN_RE.finditer(data):
        names = [n.decode("ascii") for n in m.group(0).split(b"\0") if n]
        if sum(n in anchors for n in names) >= 3:
            found.extend(names)
    return found


def _spellings(table: str, name: str) -> tuple[str, ...]:
    """How the library spells a name: ggml's type names are q8_0, nvfp4, bf16 but q4_K (gguf-py: Q4_K)."""
    if table != "tensor_types":
        return (name,)
    low = name.lower()
    return (low, low[:-2] + "_K") if low.endswith("_k") else (low,)


def _is_table_name(name: str) -> bool:
    # a run's edges can hold neighbouring literals: function names (__func__) and dotted tensor names
    return not re.search(r"\.(weigh|bias)", name) and not re.match(r"(mtmd|clip|llama|ggml|gguf)_", name)


def library_files(bin_dir: Path, server: Path) -> dict[str, Path]:
    """table -> the library holding it (llama-server itself when linked statically)."""
    found = {}
    for table, prefix in LIBRARIES.items():
        lib = library_for(bin_dir, prefix) or (server if server.is_file() else None)
        if lib is None:
            raise TablesNotFound(f"no {prefix} library next to {server}")
        found[table] = lib
    return found


def from_libraries(
    bin_dir: Path, server: Path, type_ids: dict[str, int], known: dict[str, frozenset[str]] | None = None
) -> EngineTables:
    """What the binary's libraries hold: of the names dspark knows (``known``, by table; ANCHORS and
    ``type_ids`` by default) those present, plus the runs of table strings around them.
    ``type_ids``: tensor type name -> id as dspark knows them."""
    known = {**ANCHORS, **(known or {})}
    listed: dict[str, tuple[str, ...]] = {}
    libraries: dict[str, str] = {}
    for table, lib in library_files(bin_dir, server).items():
        data = lib.read_bytes()
        libraries[table] = str(lib)
        if table == "tensor_types":
            listed[table] = tuple(
                sorted(
                    (n for n in type_ids if any(in_binary(data, s) for s in _spellings(table, n))),
                    key=type_ids.__getitem__,
                )
            )
        else:
            run = [n for n in _runs(data, known[table]) if _is_table_name(n)]
            listed[table] = tuple(dict.fromkeys([*run, *(n for n in sorted(known[table]) if in_binary(data, n))]))
    if not listed["archs"] and not listed["projectors"]:
        raise TablesNotFound(f"no arch or projector names in the libraries of {server}")
    return EngineTables(
        archs=listed["archs"],
        projectors=listed["projectors"],
        tensor_types=listed["tensor_types"],
        tensor_type_ids=tuple(type_ids[n] for n in listed["tensor_types"]),
        origin="libraries",
        where=str(bin_dir),
        libraries=tuple(libraries.items()),
    )


# ------------------------------------------------------------------ cache records


def to_record(t: EngineTables) -> dict[str, object]:
    return {
        "format": t.format,
        "origin": t.origin,
        "where": t.where,
        "backend": t.backend,
        "cuda_arch": t.cuda_arch,
        "archs": list(t.archs),
        "projectors": list(t.projectors),
        "tensor_types": list(t.tensor_types),
        "tensor_type_ids": list(t.tensor_type_ids),
        "libraries": dict(t.libraries),
    }


def from_record(data: dict[str, object]) -> EngineTables | None:
    """A cached record, or None when it is of another format or malformed (then it is recomputed)."""
    try:
        if data.get("format") != FORMAT:
            return None
        libraries = data.get("libraries") or {}
        if not isinstance(libraries, dict):
            return None
        return EngineTables(
            archs=tuple(map(str, data["archs"])),
            projectors=tuple(map(str, data["projectors"])),  # type: ignore[call-overload]
            tensor_types=tuple(map(str, data["tensor_types"])),  # type: ignore[call-overload]
            tensor_type_ids=tuple(map(int, data["tensor_type_ids"])),  # type: ignore[call-overload]
            origin=str(data["origin"]),
            where=str(data["where"]),
            backend=str(data.get("backend", "")),
            cuda_arch=str(data.get("cuda_arch", "")),
            libraries=tuple((str(k), str(v)) for k, v in libraries.items()),
        )
    except (KeyError, TypeError, ValueError):
        return None
