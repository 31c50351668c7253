"""MiniCPM-V 4.7 against upstream: image embeddings and first-token logits from one llama.cpp build (issue 31).

The oracle is upstream's own b11739 build (commit 0ce8cd114, the first release that loads 4.7), shipped
as CPU libraries in the PyPI wheel ``llama-cpp-py-sync==0.11739``. Its CFFI declarations of the llama
and mtmd C API are used for any build whose API matches them field for field (b11549 does: the
structs this script passes, llama_model_params, llama_context_params, llama_batch,
mtmd_context_params, mtmd_input_text and mtmd_decoder_pos, are the same), so the same code drives
both builds, each in its own process (two ggml libraries never share one).

    python study/minicpmv47_oracle.py probe --manifest M [--lib-dir DIR] [--image 112x112:0]
    python study/minicpmv47_oracle.py compare --manifest M --lib-dir DIR [--image ...]

What b11739 requires of the files (probed on variants of the stand-in): the mmproj's ``v.tok_embd_sep`` is
required at load ("unable to find tensor v.tok_embd_sep"); its rows are checked only when used (3 rows load,
then a sliced image aborts on GGML_ASSERT(idx < tok_embd_sep->ne[1]) at the row of "\n");
``clip.vision.projector.scale_factor`` and ``clip.vision.wa_layer_indexes`` are optional (defaults 4 and
none); ``clip.minicpmv_version`` is not needed. The target's ``rope.section_order`` other than zyxt/tyxz
fails the load ("unknown rope section order: xyzt"). dspark's patch does the same on each, except that a
missing row is an encode error (mtmd_encode_chunk returns 1), not an abort.

``probe`` prints, as JSON, the chunks mtmd made of an image + text prompt (text tokens; image
tokens, their M-RoPE decoder positions), each image chunk's embeddings, and the logits after the
whole prompt. Without ``--lib-dir`` it loads the wheel's libraries. ``compare`` probes the wheel and
``--lib-dir`` and prints the max abs differences (exit 1 when a layout differs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PROMPT = "<|im_start|>user\n<__media__>\nWhat is in the image?<|im_end|>\n<|im_start|>assistant\n"


def wheel_lib_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp_py_sync")
    if spec is None or spec.origin is None:
        raise SystemExit("the oracle needs the wheel: pip install llama-cpp-py-sync==0.11739")
    return Path(spec.origin).parent


# The wheel is built against glibc 2.38 and uses only its C23 strtol/sscanf entry points from it; on an
# older glibc (Debian 12 has 2.36) its libraries load from a copy whose GLIBC_2.38 requirement is renamed
# to GLIBC_2.2.5 and whose four __isoc23_* references bind to this shim (pre-C23 behaviour: no 0b prefix).
_SHIM_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list ap; va_start(ap, f); int r = vsscanf(s, f, ap); va_end(ap); return r;
}
"""


def _elf_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _rename_glibc_238(data: bytearray) -> int:
    """Point each GLIBC_2.38 version requirement (ELF64 .gnu.version_r) at GLIBC_2.2.5; how many were."""
    import struct

    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    renamed = 0
    for sec in sections:
        if sec[1] != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strtab_off = sections[sec[6]][4]

        def name_at(off: int, strtab_off: int = strtab_off) -> bytes:
            return bytes(data[strtab_off + off : data.index(0, strtab_off + off)])

        need, old_names = sec[4], []
        while True:
            _, cnt, _, aux_off, nxt = struct.unpack_from("<HHIII", data, need)
            aux = need + aux_off
            for _ in range(cnt):
                _, _, _, name, aux_next = struct.unpack_from("<IHHII", data, aux)
                old_names.append((aux, name_at(name), name))
                aux += aux_next
            if not nxt:
                break
            need += nxt
        target = next((n for _, text, n in old_names if text == b"GLIBC_2.2.5"), None)
        for aux, text, _ in old_names:
            if text == b"GLIBC_2.38" and target is not None:
                struct.pack_into("<I", data, aux, _elf_hash(b"GLIBC_2.2.5"))
                struct.pack_into("<I", data, aux + 8, target)
                renamed += 1
    return renamed


def _glibc_at_least(major: int, minor: int) -> bool:
    import platform

    name, version = platform.libc_ver()
    return name != "glibc" or tuple(int(x) for x in version.split(".")[:2]) >= (major, minor)


def oracle_lib_dir(cache: Path) -> Path:
    """The wheel's library folder, or (glibc < 2.38) a patched copy of it under ``cache`` with the shim."""
    src = wheel_lib_dir()
    if _glibc_at_least(2, 38):
        return src
    import hashlib
    import shutil

    key = hashlib.sha256((src / "libllama.so").read_bytes()[: 1 << 20]).hexdigest()[:12]
    out = cache / f"oracle-b11739-{key}"
    if (out / "libisoc23shim.so").exists():
        return out
    tmp = cache / f"{out.name}.part"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for lib in src.glob("lib*.so*"):
        data = bytearray(lib.read_bytes())
        _rename_glibc_238(data)
        (tmp / lib.name).write_bytes(bytes(data))
    (tmp / "isoc23shim.c").write_text(_SHIM_C)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(tmp / "libisoc23shim.so"), str(tmp / "isoc23shim.c")], check=True
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _libs(lib_dir: Path):  # type: ignore[no-untyped-def]
    import ctypes

    from llama_cpp_py_sync._cffi_bindings import ffi  # the wheel's cdef of llama.h + mtmd.h

    if (lib_dir / "libisoc23shim.so").exists():  # the oracle's copy on an older glibc: the shim goes first
        ctypes.CDLL(str(lib_dir / "libisoc23shim.so"), mode=ctypes.RTLD_GLOBAL)

    names = {"llama": "libllama.so", "mtmd": "libmtmd.so"}
    found = {k: next((p for p in (lib_dir / n, lib_dir / "bin" / n) if p.exists()), None) for k, n in names.items()}
    missing = [names[k] for k, p in found.items() if p is None]
    if missing:
        raise SystemExit(f"{lib_dir}: no {', '.join(missing)}")
    return ffi, ffi.dlopen(str(found["llama"])), ffi.dlopen(str(found["mtmd"]))


def probe(lib_dir: Path, target: Path, mmproj: Path, image: tuple[int, int, int], prompt: str = PROMPT) -> dict:
    from dsparkcli.synth.minicpmv47 import image_rgb

    ffi, L, M = _libs(lib_dir)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(target).encode(), mp)
    if model == ffi.NULL:
        raise SystemExit(f"{lib_dir}: could not load {target}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 2048, 2048, 2048, 2, 2
    ctx = L.llama_init_from_model(model, cp)
    mcp = M.mtmd_context_params_default()
    mcp.use_gpu, mcp.n_threads, mcp.warmup, mcp.print_timings = False, 2, False, False
    mctx = M.mtmd_init_from_file(str(mmproj).encode(), model, mcp)
    if mctx == ffi.NULL:
        raise SystemExit(f"{lib_dir}: could not load the mmproj {mmproj}")
    w, h, seed = image
    rgb = ffi.from_buffer(image_rgb(w, h, seed))
    bitmap = M.mtmd_bitmap_init(w, h, rgb)
    text_c = ffi.new("char[]", prompt.encode())
    text = ffi.new(
        "struct mtmd_input_text *",
        {"text": text_c, "text_len": len(prompt.encode()), "add_special": False, "parse_special": True},
    )
    chunks = M.mtmd_input_chunks_init()
    bitmaps = ffi.new("mtmd_bitmap *[1]", [bitmap])
    rc = M.mtmd_tokenize(mctx, chunks, text, ffi.cast("const mtmd_bitmap * const *", bitmaps), 1)
    if rc != 0:
        raise SystemExit(f"{lib_dir}: mtmd_tokenize returned {rc}")
    n_embd = L.llama_model_n_embd(model)
    out: dict = {"lib_dir": str(lib_dir), "use_mrope": bool(M.mtmd_decode_use_mrope(mctx)), "chunks": []}
    pos = 0
    for i in range(M.mtmd_input_chunks_size(chunks)):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        n_tok = M.mtmd_input_chunk_get_n_tokens(chunk)
        n_pos = M.mtmd_input_chunk_get_n_pos(chunk)
        if M.mtmd_input_chunk_get_type(chunk) == 0:  # MTMD_INPUT_CHUNK_TYPE_TEXT
            n = ffi.new("size_t *")
            toks = M.mtmd_input_chunk_get_tokens_text(chunk, n)
            out["chunks"].append({"type": "text", "tokens": [toks[j] for j in range(n[0])], "n_pos": n_pos})
        else:
            img = M.mtmd_input_chunk_get_tokens_image(chunk)
            dpos = [M.mtmd_image_tokens_get_decoder_pos(img, pos, j) for j in range(n_tok)]
            if M.mtmd_encode_chunk(mctx, chunk) != 0:
                raise SystemExit(f"{lib_dir}: mtmd_encode_chunk failed on chunk {i}")
            embd = M.mtmd_get_output_embd(mctx)
            rows = [[embd[r * n_embd + c] for c in range(n_embd)] for r in range(n_tok)]
            out["chunks"].append(
                {
                    "type": "image",
                    "n_tokens": n_tok,
                    "n_pos": n_pos,
                    "decoder_pos": [[p.t, p.y, p.x, p.z] for p in dpos],
                    "embd": rows,
                }
            )
        pos += n_pos
    new_n_past = ffi.new("llama_pos *")
    rc = M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, cp.n_batch, True, new_n_past)
    if rc != 0:
        raise SystemExit(f"{lib_dir}: mtmd_helper_eval_chunks returned {rc}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    logits = L.llama_get_logits_ith(ctx, -1)
    out["n_past"] = new_n_past[0]
    out["logits"] = [logits[j] for j in range(n_vocab)]
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bitmap)
    M.mtmd_free(mctx)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def probe_in_subprocess(lib_dir: Path | None, manifest: Path, image: str) -> dict:
    """``probe`` in its own process (one ggml per process); lib_dir None: the wheel's."""
    cmd = [sys.executable, __file__, "probe", "--manifest", str(manifest), "--image", image]
    if lib_dir is not None:
        cmd += ["--lib-dir", str(lib_dir)]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    if run.returncode != 0:
        raise RuntimeError(f"probe of {lib_dir or 'the wheel'} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


def differences(oracle: dict, mine: dict) -> dict:
    """Layout (must be equal) and max abs differences of embeddings and logits."""
    import numpy as np

    def layout(p: dict) -> list:
        return [(c["type"], c.get("tokens"), c.get("n_tokens"), c["n_pos"], c.get("decoder_pos")) for c in p["chunks"]]

    same_layout = layout(oracle) == layout(mine) and oracle["use_mrope"] == mine["use_mrope"]
    embd = [
        float(np.max(np.abs(np.array(a["embd"]) - np.array(b["embd"]))))
        for a, b in zip(oracle["chunks"], mine["chunks"])
        if a["type"] == "image" and b["type"] == "image" and len(a["embd"]) == len(b["embd"])
    ]
    lo, lm = np.array(oracle["logits"]), np.array(mine["logits"])
    return {
        "same_layout": same_layout,
        "n_image_chunks": sum(c["type"] == "image" for c in oracle["chunks"]),
        "embd_max_abs": embd,
        "embd_scale": max(
            (float(np.max(np.abs(np.array(c["embd"])))) for c in oracle["chunks"] if c["type"] == "image"), default=0.0
        ),
        "logits_max_abs": float(np.max(np.abs(lo - lm))) if lo.shape == lm.shape else None,
        "logits_scale": float(np.max(np.abs(lo))),
        "argmax": [int(np.argmax(lo)), int(np.argmax(lm)) if lm.size else None],
    }


def _cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark")


def _image(text: str) -> tuple[int, int, int]:
    size, _, seed = text.partition(":")
    w, _, h = size.partition("x")
    return int(w), int(h), int(seed or 0)


def main(argv: list[str] | None = None) -> int:
    from dsparkcli.synth.minicpmv47 import read_standin

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("probe", "compare"))
    ap.add_argument(
        "--manifest", type=Path, required=True, help="manifest of a `dspark synth --shape minicpm-v-4.7` stand-in"
    )
    ap.add_argument(
        "--lib-dir", type=Path, help="folder (or build folder with bin/) holding libllama.so and libmtmd.so"
    )
    ap.add_argument("--image", default="112x112:0", help="WIDTHxHEIGHT:SEED of the synthetic image")
    args = ap.parse_args(argv)
    if args.mode == "probe":
        files = read_standin(args.manifest)
        lib_dir = args.lib_dir or oracle_lib_dir(_cache_dir())
        print(json.dumps(probe(lib_dir, files.target, files.mmproj, _image(args.image))))
        return 0
    if args.lib_dir is None:
        ap.error("compare needs --lib-dir (the build to check against the wheel)")
    diff = differences(
        probe_in_subprocess(None, args.manifest, args.image),
        probe_in_subprocess(args.lib_dir, args.manifest, args.image),
    )
    print(json.dumps(diff, indent=2))
    return 0 if diff["same_layout"] else 1


if __name__ == "__main__":
    sys.exit(main())
