"""Fuzz: >= 10 000 mutated GGUF headers through the reader and every inspect function built on it.

Each mutated header either parses (and then census, summary, DSpark structure, memory estimate and
pairing must not crash on its hostile metadata) or raises a one-line GGUFError. A second pass runs
mutations under an address-space limit, and a few go through the CLI in a subprocess.
"""

from __future__ import annotations

import functools
import random
import struct
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsparkcli.errors import GGUFError
from dsparkcli.gguf import analysis, memory, pairing
from dsparkcli.gguf import reader as gc

N_EXAMPLES = int(__import__("os").environ.get("DSPARK_FUZZ_EXAMPLES", "10000"))
REPO = Path(__file__).resolve().parent.parent
INTERESTING = [
    0,
    1,
    2,
    3,
    4,
    5,
    8,
    9,
    12,
    31,
    32,
    63,
    64,
    255,
    1 << 15,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    1 << 40,
    1 << 60,
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
]


def _base(path: Path) -> bytes:
    """A small but complete dflash draft header: every value type, a nested array, tensors with data."""
    w = GGUFWriter(path, "dflash")
    w.add_name("fuzz")
    w.add_uint32("dflash.block_count", 2)
    w.add_uint32("dflash.embedding_length", 64)
    w.add_uint32("dflash.attention.head_count", 2)
    w.add_uint32("dflash.attention.head_count_kv", 1)
    w.add_uint32("dflash.block_size", 8)
    w.add_bool("dflash.sample_from_anchor", True)
    w.add_bool("dflash.has_confidence_head", False)
    w.add_array("dflash.target_layers", [0, 1])
    w.add_uint64("fuzz.u64", 7)
    w.add_int8("fuzz.i8", -3)
    w.add_float64("fuzz.f64", 0.5)
    w.add_int16("fuzz.i16", -300)
    w.add_array("fuzz.nested", [[1, 2], [3]])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(16)])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(16)])
    w.add_uint32("tokenizer.ggml.mask_token_id", 15)
    w.add_string("tokenizer.chat_template", "{{ x }}")
    w.add_tensor("fc.weight", np.ones((64, 128), dtype=np.float32))
    w.add_tensor("markov_w1.weight", np.ones((16, 32), dtype=np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.add_tensor("conf_proj.weight", np.ones((1, 96), dtype=np.float32))
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@functools.lru_cache(maxsize=1)
def base_header() -> tuple[bytes, int]:
    """(file bytes, header length) of the valid base; cached, and kept out of hypothesis' reports."""
    with tempfile.TemporaryDirectory() as tmp:
        data = _base(Path(tmp) / "base.gguf")
    return data, gc.read_header(MemSource(data)).header_bytes  # the base itself is valid


class MemSource:
    def __init__(self, data: bytes) -> None:
        self.data, self.size, self.name = data, len(data), "fuzz.gguf"

    def read_at(self, offset: int, n: int) -> bytes:
        return self.data[offset : offset + n]


def mutate(data: bytes, header_len: int, ops: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) mutations; positions mostly land in the header."""
    buf = bytearray(data)
    for kind, pos, value in ops:
        if not buf:
            break
        at = pos % min(len(buf), header_len + 64)
        if kind == 0:  # flip a byte
            buf[at] ^= (value % 255) + 1
        elif kind == 1:  # an interesting u64 (counts, lengths, offsets, dims)
            buf[at : at + 8] = struct.pack("<Q", INTERESTING[value % len(INTERESTING)])
        elif kind == 2:  # an interesting u32 / i32 (versions, types, n_dims)
            buf[at : at + 4] = struct.pack("<I", INTERESTING[value % len(INTERESTING)] & 0xFFFFFFFF)
        elif kind == 3:  # insert bytes
            buf[at:at] = bytes([value & 0xFF]) * (1 + value % 9)
        elif kind == 4:  # delete bytes
            del buf[at : at + 1 + value % 16]
        elif kind == 5:  # truncate
            del buf[at:]
        elif kind == 6:  # small integer into a type / count slot
            buf[at : at + 4] = struct.pack("<I", value % 16)
    return bytes(buf)


def exercise(data: bytes) -> str:
    """Everything inspect does with a header. Returns 'ok' or 'error'; anything unexpected propagates."""
    try:
        h = gc.read_header(MemSource(data))
    except GGUFError as e:
        message = str(e)
        assert message and "\n" not in message and len(message) < 400, message
        assert e.exit_code == 2
        return "error"
    analysis.census(h)
    analysis.summarize(h)
    analysis.dspark_structure(h)
    analysis.metadata_json(h)
    pairing.mmproj_width(h)
    memory.memory_estimate(h, 4096)
    pairing.check_pair(h, h, h)
    return "ok"


OPS = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1 << 16), st.integers(0, 1 << 16)), min_size=1, max_size=4)


@settings(
    max_examples=N_EXAMPLES,
    deadline=timedelta(seconds=2),
    database=None,  # a hang fails the example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_fuzz_mutated_headers(ops: list[tuple[int, int, int]]) -> None:
    base, header_len = base_header()
    assert exercise(mutate(base, header_len, ops)) in ("ok", "error")


# ------------------------------------------------------------------ wrongly typed metadata (well-formed bytes)

READ_KEYS = [
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "block_size",
    "target_layers",
    "sample_from_anchor",
    "has_confidence_head",
    "full_attention_interval",
    "context_length",
]
GLOBAL_KEYS = [
    "general.name",
    "general.file_type",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.model",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.mask_token_id",
    "tokenizer.chat_template",
    "clip.projector_type",
    "clip.vision.is_deepstack_layers",
]
SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _encode_value(kind: int, n: int, depth: int = 0) -> bytes:
    """A well-formed GGUF value of type ``kind`` derived from ``n`` (arrays of mixed element types)."""
    if kind in SCALAR_CODES:
        code = SCALAR_CODES[kind]
        if code in "fd":
            value: object = [0.0, -1.5, float("nan"), float("inf"), 1e30][n % 5]
        elif code == "?":
            value = bool(n % 2)
        else:
            bits = struct.calcsize(code) * 8
            value = INTERESTING[n % len(INTERESTING)] % (1 << bits)
            if code.islower() and value >= 1 << (bits - 1):
                value -= 1 << bits
        return struct.pack("<" + code, value)
    if kind == 8:
        return struct.pack("<Q", n % 7) + (b"\x1b[2J\xff\xe2\x80\xae"[: n % 7])
    elem = [4, 5, 8, 6, 7, 9, 0][n % 7] if depth < 2 else 4
    count = n % 6
    return struct.pack("<iQ", elem, count) + b"".join(_encode_value(elem, n // 7 + i, depth + 1) for i in range(count))


TYPED = st.lists(
    st.tuples(
        st.integers(0, len(READ_KEYS) + len(GLOBAL_KEYS) - 1),
        st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
        st.integers(0, 1 << 20),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda t: t[0],
)


@settings(
    max_examples=N_EXAMPLES // 5,
    deadline=timedelta(seconds=2),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(arch=st.sampled_from(["dflash", "qwen35moe", "clip", "llama", "x\x1b"]), kvs=TYPED)
def test_fuzz_wrongly_typed_metadata(arch: str, kvs: list[tuple[int, int, int]]) -> None:
    from support.gguf_fixtures import kv_str, raw_header

    entries = [("general.architecture", 8, kv_str(arch))]
    for index, kind, n in kvs:
        key = f"{arch}.{READ_KEYS[index]}" if index < len(READ_KEYS) else GLOBAL_KEYS[index - len(READ_KEYS)]
        entries.append((key, kind, _encode_value(kind, n)))
    tensors = [("markov_w1.weight", (4, 4), 0, 0), ("conf_proj.weight", (8, 1), 0, 64), ("mm.2.weight", (2, 4), 0, 96)]
    data = raw_header(entries, tensors, data=bytes(160))
    assert exercise(data) == "ok"  # well-formed bytes always parse; inspect must cope with any types


MEMORY_PROBE = r"""
import random, resource, sys
sys.path.insert(0, sys.argv[1])
from test_inspect_fuzz import base_header, exercise, mutate
base, header_len = base_header()
# cap the address space at what is mapped now + 256 MiB: a reader that sizes anything by a hostile
# count dies with MemoryError instead of passing
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))
rng = random.Random(int(sys.argv[3]))
counts = {"ok": 0, "error": 0}
for _ in range(int(sys.argv[4])):
    ops = [(rng.randrange(7), rng.randrange(1 << 16), rng.randrange(1 << 16)) for _ in range(rng.randint(1, 4))]
    counts[exercise(mutate(base, header_len, ops))] += 1
print(counts["ok"], counts["error"])
"""


def test_fuzz_memory_bounded_under_rlimit() -> None:
    r = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(REPO / "tests"), "-", "1234", "3000"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ok, errors = map(int, r.stdout.split())
    assert ok + errors == 3000 and ok > 100 and errors > 1000  # both paths exercised


def test_fuzz_cli_one_line_error_exit_2(tmp_path: Path, cli) -> None:
    rng = random.Random(99)
    base, header_len = base_header()
    seen = {"ok": 0, "error": 0}
    attempts = 0
    while min(seen.values()) < 3 and attempts < 200:
        attempts += 1
        ops = [(rng.randrange(7), rng.randrange(1 << 16), rng.randrange(1 << 16)) for _ in range(rng.randint(1, 3))]
        data = mutate(base, header_len, ops)
        kind = exercise(data)
        if seen[kind] >= 3:
            continue
        seen[kind] += 1
        path = tmp_path / f"m{attempts}.gguf"
        path.write_bytes(data)
        r = cli("inspect", str(path), "-c", "1024")
        assert "Traceback" not in r.stderr, r.stderr
        if kind == "error":
            assert r.returncode == 2 and r.stderr.startswith("dspark: error: ") and r.stderr.count("\n") == 1
        else:
            assert r.returncode == 0, r.stderr
    assert seen == {"ok": 3, "error": 3}
