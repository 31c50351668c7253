"""The bounded GGUF reader: exact census of the real draft's layout, parity with gguf-py, hostile input."""

from __future__ import annotations

import hashlib
import io
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import gguf
import pytest
from gguf import GGMLQuantizationType as Q

from dsparkcli.errors import GGUFError
from dsparkcli.gguf import analysis, hashes
from dsparkcli.gguf import reader as gc
from dsparkcli.llama import sources
from support.gguf_fixtures import (
    HEAD_DIM,
    N_BLOCKS,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    RANK,
    TAPS,
    VOCAB,
    DraftSpec,
    E,
    kv_str,
    kv_str_array,
    kv_u32,
    raw_header,
    write_draft,
    write_sparse,
)

# Element counts of the fixture draft, from its dimensions (not from the reader).
Q_OUT, KV_OUT = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
NVFP4_ELEMENTS = N_BLOCKS * (E * Q_OUT + 2 * E * KV_OUT + Q_OUT * E + 3 * E * N_FF)
Q8_ELEMENTS = len(TAPS) * E * E + 2 * RANK * VOCAB  # fc + markov_w1 + markov_w2
F32_ELEMENTS = N_BLOCKS * (7 + 2 * E + 2 * HEAD_DIM) + 2 * E + 1  # 7 scales + 4 norms per block, 2 norms, conf bias
BF16_ELEMENTS = E + RANK


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_draft(tmp_path_factory.mktemp("draft") / "dspark-q8heads.gguf")


def test_census_of_the_97_tensor_nvfp4_q8heads_layout(draft: Path) -> None:
    c = analysis.census(gc.read_header(draft))
    assert c.counts() == {"NVFP4": 35, "Q8_0": 3, "F32": 58, "BF16": 1}
    rows = {r.type_name: r for r in c.rows}
    assert rows["NVFP4"].n_elements == NVFP4_ELEMENTS == 2_949_120
    assert rows["NVFP4"].n_bytes == NVFP4_ELEMENTS // 64 * 36  # NVFP4: 64 weights in 36 bytes
    assert rows["NVFP4"].bits_per_weight == 4.5
    assert rows["Q8_0"].n_bytes == Q8_ELEMENTS // 32 * 34 and rows["Q8_0"].bits_per_weight == 8.5
    assert rows["F32"].n_bytes == F32_ELEMENTS * 4
    assert rows["BF16"].n_bytes == BF16_ELEMENTS * 2
    total = rows["NVFP4"].n_bytes + rows["Q8_0"].n_bytes + rows["F32"].n_bytes + rows["BF16"].n_bytes
    assert c.tensor_bytes == total
    assert abs(rows["NVFP4"].share - rows["NVFP4"].n_bytes / total) < 1e-12
    assert c.n_params == NVFP4_ELEMENTS + Q8_ELEMENTS + F32_ELEMENTS + BF16_ELEMENTS
    assert c.file_size == draft.stat().st_size
    assert [r.type_name for r in c.rows] == ["NVFP4", "Q8_0", "F32", "BF16"]  # largest first


def test_reader_agrees_with_gguf_py_on_every_tensor_and_key(draft: Path) -> None:
    h = gc.read_header(draft)
    ref = gguf.GGUFReader(draft)
    assert len(h.tensors) == len(ref.tensors) == 97
    for mine, theirs in zip(h.tensors, ref.tensors):
        assert mine.name == theirs.name
        assert mine.type_id == int(theirs.tensor_type)
        assert mine.shape == tuple(int(x) for x in theirs.shape)
        assert mine.n_bytes == int(theirs.n_bytes)
        assert mine.offset == int(theirs.data_offset)
    assert h.kv["dflash.block_size"] == 15
    assert h.kv["dflash.target_layers"].items == TAPS
    assert h.kv["tokenizer.ggml.tokens"].count == VOCAB
    assert h.kv["tokenizer.ggml.tokens"].items[:3] == ("tok0", "tok1", "tok2")
    assert h.kv_types["dflash.target_layers"] == "array[int32]"
    assert h.data_offset % 32 == 0 and h.header_bytes <= h.data_offset < h.header_bytes + 32


def test_token_hash_is_sha256_of_the_serialised_strings(draft: Path) -> None:
    toks = gc.read_header(draft).kv["tokenizer.ggml.tokens"]
    expected = hashlib.sha256(
        b"".join(struct.pack("<Q", len(t)) + t.encode() for t in (f"tok{i}" for i in range(VOCAB)))
    ).hexdigest()
    assert toks.sha256 == expected


def _tokens_by_hand(data: bytes) -> list[bytes]:
    """An independent walk of the tokens array: find the key, then u32 type, u64 count, (u64 len, bytes)*."""
    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    vtype, etype, count = struct.unpack_from("<IIQ", data, at)
    assert (vtype, etype) == (9, 8)
    pos, out = at + 16, []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return out


@pytest.mark.timing  # a wall-clock bound
def test_real_262k_vocab_file_within_time_and_memory_bounds() -> None:
    """llama.cpp's own ggml-vocab-gemma-4.gguf: 262 144 tokens + scores + 514 906 merges, header only."""
    path = sources.sdist_tree(sources.LLAMA_CPP_PYTHON) / "models" / "ggml-vocab-gemma-4.gguf"
    t0 = time.perf_counter()
    h = gc.read_header(path)
    elapsed = time.perf_counter() - t0
    # peak RSS growth of a fresh interpreter that parses it (tracemalloc would make this test 40x slower)
    probe = (
        "import resource, sys; from dsparkcli.gguf import reader as gc; "
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        "gc.read_header(sys.argv[1]) if len(sys.argv) > 1 else None; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)"
    )
    grown_kib = int(
        subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True).stdout
    )
    peak = grown_kib * 1024
    toks = h.kv["tokenizer.ggml.tokens"]
    by_hand = _tokens_by_hand(path.read_bytes())
    assert toks.count == len(by_hand) == 262_144
    assert toks.sha256 == hashlib.sha256(b"".join(struct.pack("<Q", len(s)) + s for s in by_hand)).hexdigest()
    assert list(toks.items) == [s.decode("utf-8", "replace") for s in by_hand]
    merges = h.kv["tokenizer.ggml.merges"]
    assert merges.count == 514_906 and merges.items is None  # counted and hashed, not kept
    assert h.kv["tokenizer.ggml.scores"].count == 262_144
    assert elapsed < 3.0, elapsed  # ~0.35 s on an idle core
    assert peak < 100 << 20, peak  # the kept token strings plus one read window


def test_items_beyond_the_cap_are_hashed_not_kept(draft: Path) -> None:
    full = gc.read_header(draft).kv["tokenizer.ggml.tokens"]
    capped = gc.read_header(draft, limits=gc.Limits(max_tokens_kept=10)).kv["tokenizer.ggml.tokens"]
    assert capped.items is None and capped.count == full.count == VOCAB and capped.sha256 == full.sha256


def test_header_cap_is_enforced(draft: Path) -> None:
    with pytest.raises(GGUFError, match="exceeds the 0 MiB cap"):
        gc.read_header(draft, limits=gc.Limits(max_header_bytes=4096))


@pytest.mark.timing  # a wall-clock bound
def test_census_of_a_20_gb_sparse_file_under_one_second(tmp_path: Path) -> None:
    path = write_sparse(tmp_path / "sparse-20g.gguf", 20 * 10**9)
    assert path.stat().st_size == 20 * 10**9 and path.stat().st_blocks * 512 < 1 << 20  # really a hole
    t0 = time.perf_counter()
    c = analysis.census(gc.read_header(path))
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert c.counts() == {"F16": 97}
    assert c.file_size == 20 * 10**9
    assert 19.9e9 < c.tensor_bytes <= c.file_size
    assert c.rows[0].bits_per_weight == 16.0


class CountingSource:
    """A range-reading source over bytes, counting what is read (what an HTTP range reader would fetch)."""

    def __init__(self, data: bytes, name: str = "mem.gguf") -> None:
        self.data, self.name, self.size, self.bytes_read, self.reads = data, name, len(data), 0, 0

    def read_at(self, offset: int, n: int) -> bytes:
        self.reads += 1
        self.bytes_read += min(n, self.size - offset)
        return self.data[offset : offset + n]


def test_range_source_reads_only_the_header(draft: Path) -> None:
    data = draft.read_bytes()
    src = CountingSource(data)
    h = gc.read_header(src)
    assert [t.name for t in h.tensors] == [t.name for t in gc.read_header(draft).tensors]
    assert src.bytes_read <= max(h.header_bytes, 64 << 10) and src.bytes_read < len(data) / 10


def test_file_object_source_works(draft: Path) -> None:
    with open(draft, "rb") as f:
        assert gc.read_header(f).tensor("markov_w1.weight").type_name == "Q8_0"
    assert gc.read_header(io.BytesIO(draft.read_bytes())).tensor("fc.weight").shape == (len(TAPS) * E, E)


def test_hash_file_matches_independent_hashes(tmp_path: Path, draft: Path) -> None:
    h = gc.read_header(draft)
    fh = hashes.hash_file(draft, h)
    data = draft.read_bytes()
    assert fh.file_sha256 == hashlib.sha256(data).hexdigest() and fh.n_bytes == len(data)
    assert len(fh.tensors) == 97
    for t in h.tensors:
        assert fh.tensors[t.name] == hashlib.sha256(data[t.offset : t.offset + t.n_bytes]).hexdigest()


def test_hash_file_regions_crossing_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, draft: Path) -> None:
    monkeypatch.setattr(hashes, "HASH_CHUNK", 4099)  # odd chunk size: every tensor straddles reads
    h = gc.read_header(draft)
    data = draft.read_bytes()
    fh = hashes.hash_file(draft, h)
    assert fh.file_sha256 == hashlib.sha256(data).hexdigest()
    assert all(
        fh.tensors[t.name] == hashlib.sha256(data[t.offset : t.offset + t.n_bytes]).hexdigest() for t in h.tensors
    )


def test_nvfp4_mxfp4_known_and_unknown_type_shown_not_crashing(tmp_path: Path) -> None:
    tensors = [("a", (64, 2), 40, 0), ("b", (32, 2), 39, 96), ("c", (8,), 77, 160)]
    data = raw_header(tensors=tensors)
    h = gc.read_header(CountingSource(data + b"\0" * 256))
    a, b, c = h.tensors
    assert (a.type_name, a.n_bytes) == ("NVFP4", 72) and (b.type_name, b.n_bytes) == ("MXFP4", 34)
    assert (c.type_name, c.n_bytes) == ("type#77", None)
    census = analysis.census(h)
    assert census.unknown_types == ("type#77",) and census.tensor_bytes == 106
    assert {r.type_name: r.n_bytes for r in census.rows}["type#77"] is None


def test_bad_utf8_value_is_data_but_bad_utf8_key_is_an_error() -> None:
    ok = gc.read_header(CountingSource(raw_header([("general.name", 8, kv_str(b"ok\xff\xfe"))])))
    assert ok.kv["general.name"] == "ok\ufffd\ufffd"
    with pytest.raises(GGUFError, match="key 0 is not valid UTF-8"):
        gc.read_header(CountingSource(raw_header([(b"bad\xff", 4, kv_u32(1))])))


HUGE = 1 << 60

# (bytes, phrase in the one-line error)
HOSTILE = {
    "empty": (b"", "bad magic"),
    "wrong magic": (b"GGML" + bytes(20), "bad magic"),
    "version 1": (raw_header(version=1), "unsupported GGUF version 1"),
    "big-endian": (raw_header(version=3 << 24), "big-endian"),
    "2^60 tensors": (raw_header(n_tensors=HUGE), "implausible tensor count"),
    "2^60 kvs": (raw_header(n_kv=HUGE), "implausible metadata count"),
    "negative tensors": (raw_header(n_tensors=-1), "implausible tensor count"),
    "2^40-byte string": (
        raw_header([("k", 8, struct.pack("<Q", 1 << 40) + b"x" * 64)]),
        "string of 1099511627776 bytes",
    ),
    "2^40-byte key": (raw_header(n_kv=1) + struct.pack("<Q", 1 << 40) + bytes(64), "string of 1099511627776 bytes"),
    "2^60 array": (raw_header([("k", 9, struct.pack("<iQ", 4, HUGE))]), "runs past the end"),
    "2^60 string array": (raw_header([("k", 9, kv_str_array(["a"], count=HUGE))]), "runs past the end"),
    "deep nesting": (raw_header([("k", 9, struct.pack("<iQ", 9, 1) * 5 + struct.pack("<iQ", 4, 0))]), "nested deeper"),
    "bad value type": (raw_header([("k", 99, b"")]), "invalid GGUF value type 99"),
    "bad array type": (raw_header([("k", 9, struct.pack("<iQ", 42, 1))]), "invalid array element type 42"),
    "duplicate key": (raw_header([("k", 4, kv_u32(1)), ("k", 4, kv_u32(2))]), "duplicate metadata key"),
    "empty key": (raw_header([("", 4, kv_u32(1))]), "is empty"),
    "alignment 3": (raw_header([("general.alignment", 4, kv_u32(3))]), "not a power of two"),
    "alignment 0": (raw_header([("general.alignment", 4, kv_u32(0))]), "not a power of two"),
    "alignment string": (raw_header([("general.alignment", 8, kv_str("32"))]), "must be uint32"),
    "5 dims": (raw_header(tensors=[("t", (1, 1, 1, 1, 1), 0, 0)]), "5 dimensions"),
    "negative dim": (
        raw_header(tensors=[("t", (-4,), 0, 0)]),
        "dimension 18446744073709551612 is beyond ggml's int64",
    ),
    "overflowing shape": (raw_header(tensors=[("t", (1 << 40, 1 << 40), 0, 0)]), "overflows 64 bits"),
    "duplicate tensor": (raw_header(tensors=[("t", (8,), 0, 0), ("t", (8,), 0, 32)]), "duplicate tensor name"),
    "long tensor name": (raw_header(tensors=[("x" * 64, (8,), 0, 0)]), "name is 64 bytes"),
    "bad utf-8 tensor name": (raw_header(tensors=[(b"t\xff", (8,), 0, 0)]), "tensor 0 name is not valid UTF-8"),
    "out of file": (raw_header(tensors=[("t", (1024,), 0, 0)]), "past the end of the file"),
    "offset past end": (raw_header(tensors=[("t", (8,), 0, 1 << 62)]), "past the end of the file"),
    "overlap": (raw_header(tensors=[("a", (16,), 0, 0), ("b", (16,), 0, 32)], data=bytes(128)), "overlap"),
    "misaligned": (raw_header(tensors=[("t", (8,), 0, 4)], data=bytes(64)), "not aligned"),
    "partial Q8_0 block": (
        raw_header(tensors=[("t", (33,), 8, 0)], data=bytes(64)),
        "not a multiple of the Q8_0 block",
    ),
    "truncated counts": (b"GGUF" + struct.pack("<I", 3) + b"\1\0", "truncated GGUF"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_headers_raise_one_line_gguf_error(name: str) -> None:
    data, phrase = HOSTILE[name]
    tracemalloc.start()
    with pytest.raises(GGUFError) as info:
        gc.read_header(CountingSource(data))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    message = str(info.value)
    assert phrase in message, message
    assert "\n" not in message and len(message) < 300
    assert info.value.exit_code == 2
    assert peak < 4 << 20, peak  # nothing sized by the hostile counts was allocated


def test_every_truncation_of_a_valid_header_is_a_gguf_error(draft: Path) -> None:
    data = draft.read_bytes()
    h = gc.read_header(draft)
    data_end = max(t.offset + t.n_bytes for t in h.tensors)  # the writer pads after the last tensor
    cut_points = (
        list(range(200)) + list(range(200, h.header_bytes, 97)) + [h.header_bytes, h.data_offset + 1, data_end - 1]
    )
    for n in cut_points:
        with pytest.raises(GGUFError, match="truncated|bad magic|implausible|past the end"):
            gc.read_header(CountingSource(data[:n]))
    assert gc.read_header(CountingSource(data[:data_end])).tensor("conf_proj.bias").n_bytes == 4


def test_alignment_key_moves_the_data_offset(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "a.gguf", "llama")
    w.add_custom_alignment(256)
    import numpy as np

    w.add_tensor("t", np.ones(10, dtype=np.float32))
    w.write_header_to_file(tmp_path / "a.gguf")
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    h = gc.read_header(tmp_path / "a.gguf")
    assert h.alignment == 256 and h.data_offset % 256 == 0
    assert h.tensors[0].offset == int(gguf.GGUFReader(tmp_path / "a.gguf").tensors[0].data_offset)


def test_bf16_heads_variant_census(tmp_path: Path) -> None:
    path = write_draft(tmp_path / "bf16heads.gguf", DraftSpec(heads=Q.BF16, conf_shape=(E + RANK, 1)))
    assert analysis.census(gc.read_header(path)).counts() == {"NVFP4": 35, "BF16": 4, "F32": 58}
