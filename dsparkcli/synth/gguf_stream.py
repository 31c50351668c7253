"""A GGUF file streamed to disk at any size: the header (metadata and tensor infos) through gguf-py, then every
tensor's data from a pre-generated buffer of valid quantised blocks (random weights of a chosen spread) or F32
initialisers, hashed while written, so a ~37 GB file needs a few MB of RAM and runs at disk speed
(``write_gguf``, ``WriteStats``). ``TensorSpec`` is one tensor to write; gguf-py and numpy are imported where
a file is written."""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsparkcli.errors import UsageError

if TYPE_CHECKING:
    import numpy as np


QTYPES = ("Q8_0", "Q4_K")

# bytes per block / weights per block of the raw quantised types we write
_QBLOCK = {"Q8_0": (34, 32), "Q4_K": (144, 256)}

ProgressFn = Callable[[int, int, str], None]  # (bytes done, bytes total, what)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: str  # F32 | Q8_0 | Q4_K
    init: str  # ones | rand | ssm_a | dt_bias | conv
    role: str = "dense"  # dense | expert | embd (read one row per token) | draft

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        if self.qtype == "F32":
            return 4 * self.n_elements
        bsz, bw = _QBLOCK[self.qtype]
        return self.n_elements // bw * bsz


_BUF_BLOCKS = 499_979  # a prime: repeats of the buffer never line up with rows or experts


def _quant_buffer(qtype: str, sigma: float, rng: np.random.Generator) -> bytes:
    """Valid blocks of ``qtype`` whose weights have mean 0 and std ``sigma``."""
    import numpy as np  # deferred: only writers need numpy

    n = _BUF_BLOCKS
    if qtype == "Q8_0":
        blocks = np.zeros(n, dtype=[("d", "<f2"), ("qs", "i1", 32)])
        blocks["qs"] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8)
        blocks["d"] = np.float16(sigma / 73.6)  # std of uniform int8 in [-127, 127]
        return blocks.tobytes()
    if qtype == "Q4_K":
        # scales bytes 0xA0 x 8 + 0x00 x 4 give sc = m = 32 in every sub-block; with dmin = 7.5 d
        # every weight is 32 d (q - 7.5): mean 0, std 147.5 d for uniform 4-bit q
        blocks = np.zeros(n, dtype=[("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
        d = sigma / 147.5
        blocks["d"], blocks["dmin"] = np.float16(d), np.float16(7.5 * d)
        blocks["scales"][:, :8] = 0xA0
        blocks["qs"] = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
        return blocks.tobytes()
    raise UsageError(f"unsupported qtype {qtype!r}; choose one of {', '.join(QTYPES)}")


def _f32_data(spec: TensorSpec, rng: np.random.Generator, sigma: float) -> bytes:
    import numpy as np  # deferred: only writers need numpy

    n = spec.n_elements
    if spec.init == "ones":
        x = np.ones(n, dtype=np.float32)
    elif spec.init == "ssm_a":  # -exp(A_log), A_log ~ log U(1, 8): decays in (0, 1)
        x = -rng.uniform(1.0, 8.0, n).astype(np.float32)
    elif spec.init == "dt_bias":
        x = rng.uniform(-4.0, -2.0, n).astype(np.float32)
    elif spec.init == "conv":
        x = rng.normal(0.0, 0.3, n).astype(np.float32)
    else:
        x = rng.normal(0.0, sigma, n).astype(np.float32)
    return x.tobytes()


def _sigma(spec: TensorSpec) -> float:
    # fan-in scaled so activations stay O(1) through 40 pre-norm residual layers; embeddings O(1)
    if spec.role == "embd":
        return 1.0
    return 0.5 / math.sqrt(spec.ne[0])


_ALIGN = 32
_CHUNK = 16 << 20


class _HashingWriter:
    """File writer that hashes in a worker thread (hashlib and file writes both release the GIL)."""

    def __init__(self, fout) -> None:  # type: ignore[no-untyped-def]
        self.fout = fout
        self.sha = hashlib.sha256()
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = None
        self.n = 0

    def write(self, data: bytes | memoryview) -> None:
        if self.pending is not None:
            self.pending.result()
        self.pending = self.pool.submit(self.sha.update, data)
        self.fout.write(data)
        self.n += len(data)

    def finish(self) -> str:
        if self.pending is not None:
            self.pending.result()
        self.pool.shutdown()
        return self.sha.hexdigest()


@dataclass(frozen=True)
class WriteStats:
    path: str
    bytes: int
    seconds: float
    sha256: str
    n_tensors: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


def write_gguf(
    path: Path,
    kv: list[tuple[str, str, object]],
    specs: list[TensorSpec],
    *,
    seed: int = 0,
    on_progress: ProgressFn | None = None,
) -> WriteStats:
    """Write a GGUF header with gguf-py, then stream every tensor's data, hashing as we go."""
    import gguf  # imported here: only writers need it
    import numpy as np  # deferred: only writers need numpy

    started = time.monotonic()
    arch = next(v for k, _, v in kv if k == "general.architecture")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(tmp, str(arch))
    w.kv_data[0].pop("general.architecture", None)  # re-added below in our order
    adders = {"str": w.add_string, "u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool}
    for key, kind, value in kv:
        if kind in adders:
            adders[kind](key, value)  # type: ignore[operator]
        elif kind == "i32[]":
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)  # type: ignore[arg-type]
        elif kind == "str[]":
            w.add_array(key, value)  # type: ignore[arg-type]
        else:
            raise AssertionError(kind)
    for s in specs:
        raw = None if s.qtype == "F32" else gguf.GGMLQuantizationType[s.qtype]
        w.add_tensor_info(s.name, tuple(reversed(s.ne)), np.dtype(np.float32), s.nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.flush()
    fout = w.fout[0]
    head_len = fout.tell()
    fout.flush()
    with open(tmp, "rb") as f:  # the header is small (the token list): hash it once, then stream
        header = f.read(head_len)
    out = _HashingWriter(fout)
    out.sha.update(header)
    out.n = head_len

    rng = np.random.default_rng(seed)
    buffers: dict[tuple[str, float], bytes] = {}
    total = sum(s.nbytes for s in specs)
    done = 0
    for s in specs:
        pad = (-out.n) % _ALIGN
        if pad:
            out.write(b"\0" * pad)
        sigma = _sigma(s)
        if s.qtype == "F32":
            out.write(_f32_data(s, rng, sigma))
        else:
            key = (s.qtype, round(sigma, 9))
            if key not in buffers:
                buffers[key] = _quant_buffer(s.qtype, sigma, rng)
            buf = memoryview(buffers[key])
            bsz = _QBLOCK[s.qtype][0]
            pos = int(rng.integers(0, _BUF_BLOCKS)) * bsz  # start somewhere else in the buffer each tensor
            left = s.nbytes
            while left:
                n = min(left, _CHUNK, len(buf) - pos)
                out.write(buf[pos : pos + n])
                left -= n
                pos = (pos + n) % len(buf)
                if on_progress:
                    on_progress(done + s.nbytes - left, total, s.name)
        done += s.nbytes
        if on_progress:
            on_progress(done, total, s.name)
    pad = (-out.n) % _ALIGN
    if pad:
        out.write(b"\0" * pad)
    digest = out.finish()
    w.close()
    os.replace(tmp, path)
    return WriteStats(str(path), out.n, round(time.monotonic() - started, 3), digest, len(specs))
