"""The one bounded GGUF header reader: KVs and tensor infos, from a local file or any byte-range source.

Used by inspect, pairing (``gguf.pairing.check_pair``), requant and bench provenance; remote reads plug in
a range source (``hub.range.HubRangeSource``). It parses the
header itself (no gguf-py, no mmap of the whole file) from anything that can read a byte range, so the
same code reads a local file and the first megabytes of a remote ``hf://`` file.

Hostile input stays bounded: every count is checked against the bytes that remain before anything is
allocated, strings and headers have caps, large arrays are hashed but only materialised up to a cap, and
every problem is a ``GGUFError`` with one line of text.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from dsparkcli.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # ggml rejects tensor names of 64 bytes or more


@dataclass(frozen=True)
class Limits:
    """Caps that keep the reader bounded on hostile files (real headers are a few MB)."""

    max_header_bytes: int = 256 << 20
    max_string_bytes: int = 64 << 20  # ggml allows 1 GiB; whole tokenizer.json strings are ~30 MB
    max_array_items_kept: int = 4096  # scores, merges, token types: hashed and counted, not kept
    max_tokens_kept: int = 1 << 19  # tokenizer.ggml.tokens is kept for pairing; real vocabularies are <= 262 144
    max_nesting: int = 3
    max_kv: int = 1 << 20
    max_tensors: int = 1 << 20


DEFAULT_LIMITS = Limits()

# GGUF value types: id -> (name, struct code, size). 8 = string and 9 = array are special.
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "?", 1),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}
T_STRING, T_ARRAY = 8, 9
VALUE_TYPE_NAMES = {**{k: v[0] for k, v in _SCALARS.items()}, T_STRING: "string", T_ARRAY: "array"}


def _ggml_type_table() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from gguf-py plus what 0c1e570 adds."""
    table: dict[int, tuple[str, int, int]] = {}
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        for qtype, (block, size) in GGML_QUANT_SIZES.items():
            table[int(qtype)] = (GGMLQuantizationType(qtype).name, block, size)
    except Exception:  # noqa: BLE001, S110 - the fallback below covers the types dspark cares about
        pass
    # Known to llama.cpp 0c1e570 (ggml.h, ggml-common.h) whatever gguf-py version is installed.
    for tid, entry in {
        0: ("F32", 1, 4),
        1: ("F16", 1, 2),
        8: ("Q8_0", 32, 34),
        14: ("Q6_K", 256, 210),
        30: ("BF16", 1, 2),
        39: ("MXFP4", 32, 17),
        40: ("NVFP4", 64, 36),
        41: ("Q1_0", 128, 18),
        42: ("Q2_0", 64, 18),
    }.items():
        table.setdefault(tid, entry)
    return table


@functools.cache
def ggml_types() -> dict[int, tuple[str, int, int]]:
    """The type table, built on first use: gguf-py pulls in numpy (~0.1 s every command would pay)."""
    return _ggml_type_table()


def ggml_type_name(type_id: int) -> str:
    entry = ggml_types().get(type_id)
    return entry[0] if entry else f"type#{type_id}"


# ------------------------------------------------------------------ byte sources


class ByteSource(Protocol):
    """Anything that can read a byte range: a local file, an HTTP range reader."""

    name: str
    size: int

    def read_at(self, offset: int, n: int) -> bytes: ...


class FileSource:
    """A seekable binary file object (or a path) read by range."""

    def __init__(self, fileobj: BinaryIO, name: str = "", size: int | None = None) -> None:
        self._f = fileobj
        self.name = name or str(getattr(fileobj, "name", "<stream>"))
        if size is None:
            fileobj.seek(0, io.SEEK_END)
            size = fileobj.tell()
        self.size = size
        self.bytes_read = 0

    def read_at(self, offset: int, n: int) -> bytes:
        self._f.seek(offset)
        data = self._f.read(n)
        self.bytes_read += len(data)
        return data


class _Cursor:
    """Sequential reads over a ByteSource through a growing window (few, larger range reads)."""

    FIRST_CHUNK = 64 << 10
    MAX_CHUNK = 8 << 20

    def __init__(self, src: ByteSource, limits: Limits) -> None:
        self.src = src
        self.limits = limits
        self.pos = 0
        self._buf = b""
        self._base = 0  # file offset of _buf[0]
        self._chunk = self.FIRST_CHUNK

    def remaining(self) -> int:
        return self.src.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > self.src.size:
            raise GGUFError(
                f"{self.src.name}: truncated GGUF: {what} needs {n} bytes at offset {self.pos}, "
                f"file has {self.src.size}"
            )
        if end > self.limits.max_header_bytes:
            raise GGUFError(
                f"{self.src.name}: GGUF header exceeds the {self.limits.max_header_bytes >> 20} MiB cap "
                f"while reading {what}"
            )
        buf_end = self._base + len(self._buf)
        if end > buf_end:
            keep = self._buf[self.pos - self._base :]
            want = max(end - buf_end, self._chunk)
            want = min(want, self.src.size - buf_end, self.limits.max_header_bytes - buf_end)
            got = self.src.read_at(buf_end, want)
            if len(got) < end - buf_end:
                raise GGUFError(f"{self.src.name}: short read at offset {buf_end} (file changed while reading?)")
            self._buf = keep + got
            self._base = self.pos
            self._chunk = min(self._chunk * 2, self.MAX_CHUNK)
        start = self.pos - self._base
        self.pos = end
        return self._buf[start : start + n]

    def unpack(self, code: str, size: int, what: str) -> Any:
        return struct.unpack("<" + code, self.take(size, what))[0]

    def u32(self, what: str) -> int:
        return self.unpack("I", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("Q", 8, what)

    def raw_string(self, what: str) -> bytes:
        n = self.u64(what)
        if n > self.limits.max_string_bytes:
            raise GGUFError(
                f"{self.src.name}: {what}: string of {n} bytes exceeds the "
                f"{self.limits.max_string_bytes >> 20} MiB cap"
            )
        if n > self.remaining():
            raise GGUFError(f"{self.src.name}: {what}: string of {n} bytes runs past the end of the file")
        return self.take(n, what)

    def string_items(self, count: int, what: str, hasher: Any, keep: bool) -> tuple[str, ...] | None:
        """A string array's items; the fast path slices the window directly (250k tokens in ~0.1 s)."""
        out: list[str] | None = [] if keep else None
        max_len = self.limits.max_string_bytes
        unpack_u64 = _U64.unpack_from
        for _ in range(count):
            buf = self._buf
            p = self.pos - self._base
            if p + 8 <= len(buf):
                (n,) = unpack_u64(buf, p)
                if n <= max_len and p + 8 + n <= len(buf):  # the window never extends past the file or cap
                    item = buf[p : p + 8 + n]
                    self.pos += 8 + n
                    hasher.update(item)
                    if out is not None:
                        out.append(item[8:].decode("utf-8", errors="replace"))
                    continue
            raw = self.raw_string(what)  # slow path: refills and the bound checks
            hasher.update(_U64.pack(len(raw)))
            hasher.update(raw)
            if out is not None:
                out.append(raw.decode("utf-8", errors="replace"))
        return tuple(out) if out is not None else None


_U64 = struct.Struct("<Q")


# ------------------------------------------------------------------ data model


@dataclass(frozen=True)
class GGUFArray:
    """A metadata array. ``items`` is materialised only up to ``Limits.max_array_items_kept`` entries.

    ``sha256`` covers the serialised payload (each string as u64 length + bytes), so two token lists are
    identical exactly when count and sha256 are.
    """

    elem_type: str
    count: int
    sha256: str
    items: tuple[Any, ...] | None = field(repr=False)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml ne order: ne[0] (the row length) first, as gguf_dump prints it
    type_id: int
    type_name: str  # "Q8_0", or "type#77" when this build does not know the id
    n_elements: int
    n_bytes: int | None  # None when the type is unknown
    offset: int  # absolute file offset of the data region


@dataclass(frozen=True)
class GGUFHeader:
    name: str
    version: int
    file_size: int
    alignment: int
    header_bytes: int  # where the tensor infos end
    data_offset: int
    kv: dict[str, Any]
    kv_types: dict[str, str]
    tensors: tuple[TensorInfo, ...]
    remote_sha256: str | None = None  # what the hub reports (LFS sha256) for a remote file; never computed here

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    @property
    def arch(self) -> str:
        value = self.kv.get("general.architecture")
        return value if isinstance(value, str) else ""

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.kv.get(f"{self.arch}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def tensor_map(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


# ------------------------------------------------------------------ parsing


TOKENS_KEY = "tokenizer.ggml.tokens"


def _read_value(
    cur: _Cursor, vtype: int, what: str, depth: int, hasher: Any | None, keep: bool, max_items: int | None = None
) -> Any:
    if vtype in _SCALARS:
        _, code, size = _SCALARS[vtype]
        raw = cur.take(size, what)
        if hasher is not None:
            hasher.update(raw)
        value = struct.unpack("<" + code, raw)[0]
        return bool(value) if vtype == 7 else value
    if vtype == T_STRING:
        raw = cur.raw_string(what)
        if hasher is not None:
            hasher.update(struct.pack("<Q", len(raw)))
            hasher.update(raw)
        # values are data: keep them even if the bytes are not UTF-8 (replacement characters show it)
        return raw.decode("utf-8", errors="replace") if keep else None
    if vtype == T_ARRAY:
        return _read_array(cur, what, depth + 1, hasher, keep, max_items)
    raise GGUFError(f"{cur.src.name}: {what}: invalid GGUF value type {vtype}")


def _read_array(
    cur: _Cursor, what: str, depth: int, outer: Any | None, keep: bool, max_items: int | None = None
) -> GGUFArray:
    limits = cur.limits
    if depth > limits.max_nesting:
        raise GGUFError(f"{cur.src.name}: {what}: arrays nested deeper than {limits.max_nesting}")
    head = cur.take(12, what)
    etype, count = struct.unpack("<iQ", head)
    if etype not in VALUE_TYPE_NAMES:
        raise GGUFError(f"{cur.src.name}: {what}: invalid array element type {etype}")
    min_item = _SCALARS[etype][2] if etype in _SCALARS else (8 if etype == T_STRING else 12)
    if count * min_item > cur.remaining():
        raise GGUFError(
            f"{cur.src.name}: {what}: array of {count} {VALUE_TYPE_NAMES[etype]} runs past the end of the file"
        )
    hasher = hashlib.sha256()
    keep_items = keep and count <= (limits.max_array_items_kept if max_items is None else max_items)
    items: tuple[Any, ...] | None
    if etype in _SCALARS:
        _, code, size = _SCALARS[etype]
        raw = cur.take(count * size, what)
        hasher.update(raw)
        items = None
        if keep_items:
            values = struct.unpack(f"<{count}{code}", raw)
            items = tuple(bool(v) for v in values) if etype == 7 else values
    elif etype == T_STRING:
        items = cur.string_items(count, what, hasher, keep_items)
    else:
        collected: list[Any] | None = [] if keep_items else None
        for _ in range(count):
            value = _read_value(cur, etype, what, depth, hasher, keep_items)
            if collected is not None:
                collected.append(value)
        items = tuple(collected) if collected is not None else None
    if outer is not None:
        outer.update(head)
        outer.update(hasher.digest())
    return GGUFArray(VALUE_TYPE_NAMES[etype], count, hasher.hexdigest(), items)


def _q(name: str) -> str:
    """A key or tensor name for an error message: quoted, escaped, short (names can be megabytes)."""
    return repr(name if len(name) <= 48 else name[:48] + "…")


def _decode_name(raw: bytes, what: str, src: ByteSource) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GGUFError(f"{src.name}: {what} is not valid UTF-8") from None


def _as_source(source: ByteSource | str | os.PathLike[str] | BinaryIO) -> tuple[ByteSource, BinaryIO | None]:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        f = open(path, "rb")  # noqa: SIM115 - closed by read_header
        return FileSource(f, str(path), os.fstat(f.fileno()).st_size), f
    if hasattr(source, "read_at") and hasattr(source, "size"):
        return source, None  # type: ignore[return-value]
    return FileSource(source), None  # type: ignore[arg-type]


def read_header(
    source: ByteSource | str | os.PathLike[str] | BinaryIO, *, limits: Limits = DEFAULT_LIMITS
) -> GGUFHeader:
    """Parse and validate a GGUF header (never the tensor data). Raises GGUFError on anything malformed."""
    src, owned = _as_source(source)
    try:
        return _parse(src, limits)
    except RecursionError:  # belt and braces: nesting is capped, but never leak a traceback
        raise GGUFError(f"{src.name}: GGUF metadata nested too deeply") from None
    finally:
        if owned is not None:
            owned.close()


def _parse(src: ByteSource, limits: Limits) -> GGUFHeader:
    cur = _Cursor(src, limits)
    if src.size < 4 or cur.take(4, "magic") != GGUF_MAGIC:
        raise GGUFError(f"{src.name}: not a GGUF file (bad magic)")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (big-endian GGUF?)" if version >= 1 << 16 else ""
        raise GGUFError(f"{src.name}: unsupported GGUF version {version}{hint}; dspark reads versions 2 and 3")
    # uint64 in the GGUF spec (ggml reads int64): unsigned here, so a hostile count prints as written
    n_tensors, n_kv = struct.unpack("<QQ", cur.take(16, "counts"))
    # the smallest tensor info is 24 bytes and the smallest KV 13: reject absurd counts before any loop
    if n_tensors > limits.max_tensors or n_tensors * 24 > cur.remaining():
        raise GGUFError(f"{src.name}: implausible tensor count {n_tensors} for a {src.size}-byte file")
    if n_kv > limits.max_kv or n_kv * 13 > cur.remaining():
        raise GGUFError(f"{src.name}: implausible metadata count {n_kv} for a {src.size}-byte file")

    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    for i in range(n_kv):
        key = _decode_name(cur.raw_string(f"key {i}"), f"key {i}", src)
        if not key:
            raise GGUFError(f"{src.name}: metadata key {i} is empty")
        if key in kv:
            raise GGUFError(f"{src.name}: duplicate metadata key {_q(key)}")
        vtype = cur.unpack("i", 4, f"type of {_q(key)}")
        if vtype not in VALUE_TYPE_NAMES:
            raise GGUFError(f"{src.name}: key {_q(key)} has invalid GGUF value type {vtype}")
        kv[key] = _read_value(
            cur, vtype, f"value of {_q(key)}", 0, None, True, limits.max_tokens_kept if key == TOKENS_KEY else None
        )
        kv_types[key] = VALUE_TYPE_NAMES[vtype]
        if isinstance(kv[key], GGUFArray):
            kv_types[key] = f"array[{kv[key].elem_type}]"

    alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in kv and kv_types["general.alignment"] != "uint32":
        raise GGUFError(f"{src.name}: general.alignment must be uint32, is {kv_types['general.alignment']}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{src.name}: general.alignment {alignment} is not a power of two")

    raw_infos = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = _decode_name(cur.raw_string(f"tensor {i} name"), f"tensor {i} name", src)
        if len(name.encode()) >= GGML_MAX_NAME:
            raise GGUFError(
                f"{src.name}: tensor {i} name is {len(name.encode())} bytes (ggml allows {GGML_MAX_NAME - 1})"
            )
        if name in seen:
            raise GGUFError(f"{src.name}: duplicate tensor name {_q(name)}")
        seen.add(name)
        n_dims = cur.u32(f"dims of {_q(name)}")
        if n_dims > GGML_MAX_DIMS:
            raise GGUFError(f"{src.name}: tensor {_q(name)} has {n_dims} dimensions (max {GGML_MAX_DIMS})")
        shape = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"shape of {_q(name)}"))  # uint64, as counts
        type_id, offset = struct.unpack("<iQ", cur.take(12, f"type of {_q(name)}"))
        raw_infos.append((name, shape, type_id, offset))
    header_bytes = cur.pos
    data_offset = -(-header_bytes // alignment) * alignment if n_tensors else header_bytes

    tensors = tuple(
        _tensor_info(src, name, shape, type_id, offset, alignment, data_offset)
        for name, shape, type_id, offset in raw_infos
    )
    _check_layout(src, tensors)
    return GGUFHeader(src.name, version, src.size, alignment, header_bytes, data_offset, kv, kv_types, tensors)


def _tensor_info(
    src: ByteSource, name: str, shape: tuple[int, ...], type_id: int, offset: int, alignment: int, data_offset: int
) -> TensorInfo:
    n_elements = 1
    for dim in shape:
        if dim >= 1 << 63:  # ggml's int64 ne[] would read it as negative and refuse the file
            raise GGUFError(f"{src.name}: tensor {_q(name)} dimension {dim} is beyond ggml's int64 range")
        n_elements *= dim
    if n_elements >= 1 << 63:
        raise GGUFError(f"{src.name}: tensor {_q(name)} shape {shape} overflows 64 bits")
    if offset % alignment:
        raise GGUFError(f"{src.name}: tensor {_q(name)} data offset {offset} is not aligned to {alignment}")
    n_bytes = None
    entry = ggml_types().get(type_id)
    if entry is not None:
        type_name, block, size = entry
        row = shape[0] if shape else 1
        if row % block:
            raise GGUFError(
                f"{src.name}: tensor {_q(name)} rows of {row} are not a multiple of the {type_name} block ({block})"
            )
        n_bytes = n_elements // block * size
    return TensorInfo(name, tuple(shape), type_id, ggml_type_name(type_id), n_elements, n_bytes, data_offset + offset)


def _check_layout(src: ByteSource, tensors: tuple[TensorInfo, ...]) -> None:
    """Every data region inside the file, no two overlapping."""
    prev: TensorInfo | None = None
    for t in sorted(tensors, key=lambda t: (t.offset, t.n_bytes or 0)):
        end = t.offset + (t.n_bytes or 0)
        if t.offset > src.size or end > src.size:
            raise GGUFError(
                f"{src.name}: tensor {_q(t.name)} data [{t.offset}, {end}) lies past the end of the file "
                f"({src.size} bytes): truncated download?"
            )
        if prev is not None and prev.n_bytes is not None and t.offset < prev.offset + prev.n_bytes:
            raise GGUFError(f"{src.name}: tensors {_q(prev.name)} and {_q(t.name)} overlap")
        prev = t
