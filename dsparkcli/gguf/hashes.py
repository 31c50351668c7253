"""Did the data change? ``hash_file``: the sha256 of a GGUF file and of every tensor's data region in one pass
(``FileHashes``); ``diff_tensors``: two files' tensors compared by those hashes (``TensorDiff``: identical,
respelled shapes, changed, only in one), the rule `dspark inspect --against` and `dspark requant` share."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dsparkcli.gguf.reader import GGUFHeader

HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileHashes:
    file_sha256: str
    tensors: dict[str, str]  # tensor name -> sha256 of its data region
    n_bytes: int
    seconds: float


def hash_file(
    path: str | os.PathLike[str], header: GGUFHeader | None = None, progress: Callable[[int], None] | None = None
) -> FileHashes:
    """sha256 of the whole file and of every tensor data region, in one pass of 8 MiB reads.

    The whole-file digest runs on a worker thread (hashlib releases the GIL), the per-tensor digests on
    this one, so hashing both costs about as much wall time as one ``sha256sum``.
    """
    regions = sorted(
        (
            (t.offset, t.offset + t.n_bytes, t.name)
            for t in (header.tensors if header else ())
            if t.n_bytes is not None
        ),
        key=lambda r: r[0],
    )
    file_hasher = hashlib.sha256()
    tensor_hashers = {name: hashlib.sha256() for _, _, name in regions}
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)  # bounded: at most ~32 MiB in flight

    def file_worker() -> None:
        while (chunk := chunks.get()) is not None:
            file_hasher.update(chunk)

    worker = threading.Thread(target=file_worker, name="dspark-sha256", daemon=True)
    started = time.perf_counter()
    worker.start()
    pos = 0
    ri = 0
    try:
        with open(path, "rb", buffering=0) as f:
            while True:
                chunk = f.read(HASH_CHUNK)
                if not chunk:
                    break
                chunks.put(chunk)
                end = pos + len(chunk)
                view = memoryview(chunk)
                while ri < len(regions) and regions[ri][0] < end:
                    start, stop, name = regions[ri]
                    lo, hi = max(start, pos), min(stop, end)
                    if hi > lo:
                        tensor_hashers[name].update(view[lo - pos : hi - pos])
                    if stop <= end:
                        ri += 1
                    else:
                        break
                pos = end
                if progress is not None:
                    progress(len(chunk))
    finally:
        chunks.put(None)
        worker.join()
    return FileHashes(
        file_hasher.hexdigest(),
        {name: h.hexdigest() for name, h in tensor_hashers.items()},
        pos,
        time.perf_counter() - started,
    )


@dataclass(frozen=True)
class TensorChange:
    name: str
    a_type: str
    b_type: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    a_bytes: int | None
    b_bytes: int | None


@dataclass(frozen=True)
class TensorDiff:
    a: str
    b: str
    n_a: int
    n_b: int
    identical: tuple[str, ...]  # same type, same element count, same data sha256
    respelled: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # identical but shape written differently
    changed: tuple[TensorChange, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @property
    def summary(self) -> str:
        return (
            f"{len(self.identical)}/{max(self.n_a, self.n_b)} identical, {len(self.changed)} changed, "
            f"{len(self.only_a)} only in A, {len(self.only_b)} only in B"
        )


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x for x in shape if x != 1) or (1,)


def diff_tensors(a: GGUFHeader, a_hashes: FileHashes, b: GGUFHeader, b_hashes: FileHashes) -> TensorDiff:
    """Every tensor's data region compared by sha256; (2304, 1) and (2304) count as the same shape."""
    ta, tb = a.tensor_map(), b.tensor_map()
    identical, respelled, changed = [], [], []
    for name, x in ta.items():
        y = tb.get(name)
        if y is None:
            continue
        same = (
            x.type_id == y.type_id
            and x.n_elements == y.n_elements
            and _squeeze(x.shape) == _squeeze(y.shape)
            and a_hashes.tensors.get(name) is not None
            and a_hashes.tensors.get(name) == b_hashes.tensors.get(name)
        )
        if same:
            identical.append(name)
            if x.shape != y.shape:
                respelled.append((name, x.shape, y.shape))
        else:
            changed.append(TensorChange(name, x.type_name, y.type_name, x.shape, y.shape, x.n_bytes, y.n_bytes))
    return TensorDiff(
        a=a.name,
        b=b.name,
        n_a=len(ta),
        n_b=len(tb),
        identical=tuple(identical),
        respelled=tuple(respelled),
        changed=tuple(changed),
        only_a=tuple(n for n in ta if n not in tb),
        only_b=tuple(n for n in tb if n not in ta),
    )
