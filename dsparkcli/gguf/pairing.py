"""Does a draft (and/or a vision projector) fit a target? Headers only, cheap enough to run before launch.

``check_pair`` is the one pairing rule: ``dspark inspect`` shows its checks, and ``pairs.check_pairing``
refuses a wrong pair with it before llama.cpp can assert on it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import UsageError
from dsparkcli.gguf.analysis import dspark_structure, int_of, printable, role_of, str_of
from dsparkcli.gguf.loadable import PairCheck, check_loads, projector_types
from dsparkcli.gguf.reader import GGUFArray, GGUFHeader, read_header
from dsparkcli.llama.tables import EngineTables

# Target archs whose graph fills t_layer_inp (llama.cpp 0c1e570, grep t_layer_inp in src/models/); only
# these can feed a DFlash/DSpark draft. The second set also exposes index n_layer (the last layer's output).
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama",
        "llama-embed",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "gemma4",
        "lfm2",
        "mimo2",
        "minimax-01",
        "minimax-m2",
        "muse-glimmer",
        "nanbeige",
        "nemotron_h",
        "nemotron_h_moe",
        "gpt-oss",
        "bailingmoe3",
        "hunyuan_vl",
        "deepseek4",
    }
)
LAST_LAYER_TAP_ARCHS = frozenset({"mimo2", "nemotron_h", "nemotron_h_moe", "deepseek4"})

# clip projector type -> (tensor, ne index) giving the width it feeds the text model (clip_n_mmproj_embd).
MMPROJ_WIDTH = {
    **{
        p: ("mm.2.weight", 1)
        for p in (
            "mlp",
            "phi4",
            "pixtral",
            "lightonocr",
            "dots_ocr",
            "muse-glimmer",
            "ultravox",
            "voxtral",
            "musicflamingo",
            "qwen3a",
            "glma",
            "lfm2",
            "kimivl",
            "paddleocr",
            "kimik25",
            "yasa2",
            "deepseek4v",
            "mimo_audio",
        )
    },
    "mlp_norm": ("mm.3.bias", 0),
    "resampler": ("resampler.proj.weight", 0),
    "minicpmv4_6": ("mm.down.weight", 1),
    "glm4v": ("mm.down.weight", 1),
    "glm5v": ("mm.down.weight", 1),
    "qwen2vl_merger": ("mm.2.bias", 0),
    "qwen2.5vl_merger": ("mm.2.bias", 0),
    "ling3vl": ("mm.2.bias", 0),
    "gemma3": ("mm.input_projection.weight", 0),
    "gemma3nv": ("mm.input_projection.weight", 0),
    "gemma4v": ("mm.input_projection.weight", 1),
    "gemma4uv": ("mm.input_projection.weight", 1),
    "idefics3": ("mm.model.fc.weight", 1),
    "internvl": ("mm.3.weight", 1),
    "nemotron_v2_vl": ("mm.3.weight", 1),
}


# ------------------------------------------------------------------ pairing


@dataclass(frozen=True)
class PairVerdict:
    ok: bool
    reasons: tuple[str, ...]  # one per failed check
    checks: tuple[PairCheck, ...]
    target: str = ""
    draft: str | None = None
    mmproj: str | None = None

    def misfit(self) -> str:
        """One line naming the file(s) that fail and why: "mmproj m.gguf does not fit target t.gguf: ..."."""
        failed = [c for c in self.checks if c.ok is False]
        names = {"draft": self.draft, "mmproj": self.mmproj}
        roles = [r for r in ("draft", "mmproj") if any(c.role == r for c in failed)]
        why = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        if not roles:  # the target itself (an mmproj or a draft given as the target)
            return f"target {self.target} cannot be paired: {why}"
        who = " and ".join(f"{r} {names[r]}" for r in roles)
        return f"{who} {'does' if len(roles) == 1 else 'do'} not fit target {self.target}: {why}"


def _first_token_difference(a: GGUFArray, b: GGUFArray) -> str:
    if a.items is None or b.items is None:
        return ""
    for i, (x, y) in enumerate(zip(a.items, b.items)):
        if x != y:
            return f"; first difference at id {i}: {printable(x, 24)!s} vs {printable(y, 24)!s}"
    return ""


def mmproj_width(h: GGUFHeader) -> tuple[int | None, str]:
    """(width the projector feeds the text model, how it was found)."""
    ptype = next(iter(projector_types(h)), "") or "mlp"
    tensors = h.tensor_map()
    if ptype in MMPROJ_WIDTH:
        name, axis = MMPROJ_WIDTH[ptype]
        t = tensors.get(name)
        if t is not None and len(t.shape) > axis:
            return t.shape[axis], f"{name} ne[{axis}] ({printable(ptype, 40)})"
    if ptype == "qwen3vl_merger":
        t = tensors.get("mm.2.bias")
        deep = h.get("clip.vision.is_deepstack_layers")
        n_deep = sum(1 for x in (deep.items or ()) if x) if isinstance(deep, GGUFArray) else 0
        if t is not None and t.shape:
            return t.shape[0] * (1 + n_deep), f"mm.2.bias ne[0] x (1 + {n_deep} deepstack) (qwen3vl_merger)"
    return None, f"projector type '{printable(ptype, 40)}' not known to dspark"


def _tokenizer_checks(t: GGUFHeader, d: GGUFHeader) -> list[PairCheck]:
    """The draft speaks the target's tokens: the same token strings (count and sha256), BOS and EOS.
    A DSpark draft and a classic (draft-simple) draft model alike."""
    draft_check = functools.partial(PairCheck, role="draft")
    checks = []
    tt, dt = t.get("tokenizer.ggml.tokens"), d.get("tokenizer.ggml.tokens")
    if not isinstance(tt, GGUFArray) or not isinstance(dt, GGUFArray):
        which = "target" if not isinstance(tt, GGUFArray) else "draft"
        checks.append(draft_check("vocab", False, f"{which} has no tokenizer.ggml.tokens"))
    elif tt.count != dt.count:
        checks.append(draft_check("vocab", False, f"target has {tt.count} tokens, draft {dt.count}"))
    elif tt.sha256 != dt.sha256:
        checks.append(
            draft_check(
                "vocab",
                False,
                f"same count ({tt.count}) but different token strings" + _first_token_difference(tt, dt),
            )
        )
    else:
        checks.append(draft_check("vocab", True, f"{tt.count} tokens, sha256 {tt.sha256[:12]} in both"))
    for key, label in (("tokenizer.ggml.bos_token_id", "BOS"), ("tokenizer.ggml.eos_token_id", "EOS")):
        tv, dv = int_of(t.get(key)), int_of(d.get(key))
        checks.append(
            draft_check(
                label,
                tv == dv,
                f"target {tv if tv is not None else 'unset'}, draft {dv if dv is not None else 'unset'}",
            )
        )
    return checks


def check_classic_pair(
    target: str | os.PathLike[str] | GGUFHeader, draft: str | os.PathLike[str] | GGUFHeader
) -> PairVerdict:
    """Does this classic draft model (llama.cpp's draft-simple: a small model of the target's family) fit
    this target? Both text models, and the same tokenizer (``_tokenizer_checks``, as for a DSpark draft)."""
    t, d = open_header(target), open_header(draft)
    checks = [
        PairCheck(
            "target role",
            role_of(t) == "target",
            f"arch {printable(t.arch or '?', 40)}" + ("" if role_of(t) == "target" else " is not a text model"),
            role="target",
        ),
        PairCheck(
            "draft role",
            role_of(d) == "target",
            f"arch {printable(d.arch or '?', 40)}"
            + (
                ""
                if role_of(d) == "target"
                else " is not a text model (draft-simple runs a small model of the target's family)"
            ),
            role="draft",
        ),
    ]
    checks.extend(_tokenizer_checks(t, d))
    reasons = tuple(f"{c.name}: {c.detail}" for c in checks if c.ok is False)
    return PairVerdict(ok=not reasons, reasons=reasons, checks=tuple(checks), target=t.name, draft=d.name)


def open_header(spec: str | os.PathLike[str] | GGUFHeader) -> GGUFHeader:
    """A local file's header (a header passes through: remote ``hf://`` files are read by ``hub.range``)."""
    if isinstance(spec, GGUFHeader):
        return spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(f"file not found: {printable(str(spec))}")
    return read_header(path)


def check_pair(
    target: str | os.PathLike[str] | GGUFHeader,
    draft: str | os.PathLike[str] | GGUFHeader | None = None,
    mmproj: str | os.PathLike[str] | GGUFHeader | None = None,
    *,
    tables: EngineTables | None = None,
) -> PairVerdict:
    """Does this draft (and/or mmproj) fit this target, and (given the engine's ``tables``) can the engine
    load each of them? Headers only, so cheap enough to run before launch."""
    t = open_header(target)
    d = open_header(draft) if draft is not None else None
    m = open_header(mmproj) if mmproj is not None else None
    checks: list[PairCheck] = []
    if tables is not None:
        for h in (t, d, m):
            if h is not None:
                checks.extend(check_loads(h, tables))
    t_layers = int_of(t.arch_key("block_count"))
    t_embd = int_of(t.arch_key("embedding_length"))
    checks.append(
        PairCheck(
            "target role",
            role_of(t) == "target",
            f"arch {printable(t.arch or '?', 40)}" + ("" if role_of(t) == "target" else " is not a text model"),
            role="target",
        )
    )
    draft_check = functools.partial(PairCheck, role="draft")  # the draft's fit to the target
    mmproj_check = functools.partial(PairCheck, role="mmproj")
    if d is not None:
        arch_ok = t.arch in LAYER_INPUT_ARCHS
        checks.append(
            draft_check(
                "target exposes layer inputs",
                arch_ok,
                f"{printable(t.arch or '?', 40)} "
                + (
                    "fills t_layer_inp"
                    if arch_ok
                    else "does not fill t_layer_inp: llama.cpp cannot feed a DFlash/DSpark draft from it"
                ),
            )
        )
        checks.append(
            draft_check(
                "draft arch",
                d.arch == "dflash",
                f"{printable(d.arch or '?', 40)}" + ("" if d.arch == "dflash" else " (expected dflash)"),
            )
        )
        checks.extend(_tokenizer_checks(t, d))
        d_embd = int_of(d.arch_key("embedding_length"))
        checks.append(
            draft_check("hidden size", t_embd is not None and t_embd == d_embd, f"target {t_embd}, draft {d_embd}")
        )
        s = dspark_structure(d)
        taps = s.target_layers if s else ()
        limit = (t_layers + 1) if (t_layers is not None and t.arch in LAST_LAYER_TAP_ARCHS) else t_layers
        if not taps:
            checks.append(draft_check("taps", False, "draft has no dflash.target_layers"))
        elif limit is None:
            checks.append(draft_check("taps", False, f"target has no {printable(t.arch, 40)}.block_count"))
        else:
            bad = [x for x in taps if not 0 <= x < limit]
            checks.append(
                draft_check(
                    "taps",
                    not bad,
                    f"{list(taps)} vs {t_layers} target blocks"
                    + (f": {bad} out of range (must be < {limit})" if bad else ""),
                )
            )
        if s is not None:
            checks.append(
                draft_check(
                    "draft structure",
                    not s.problems,
                    "; ".join(s.problems) or f"{s.kind}, block {s.block_size}, all required tensors present",
                )
            )
    if m is not None:
        if m.arch != "clip":
            checks.append(mmproj_check("mmproj arch", False, f"{printable(m.arch or '?', 40)} (expected clip)"))
        else:
            width, how = mmproj_width(m)
            if width is None:
                checks.append(mmproj_check("mmproj width", None, how))
            else:
                checks.append(
                    mmproj_check(
                        "mmproj width",
                        width == t_embd,
                        f"the projector feeds {width}-wide embeddings ({how}), the target's are {t_embd}",
                    )
                )
    reasons = tuple(f"{c.name}: {c.detail}" for c in checks if c.ok is False)
    return PairVerdict(
        ok=not reasons,
        reasons=reasons,
        checks=tuple(checks),
        target=t.name,
        draft=d.name if d else None,
        mmproj=m.name if m else None,
    )


SYNTHETIC_NAME = "dspark synthetic"  # general.name prefix of every file `dspark synth` writes


@dataclass(frozen=True)
class AcceptanceKind:
    """Whether a pair's acceptance figures are REAL (a real draft on a real target) or SYNTHETIC."""

    label: str  # REAL | SYNTHETIC
    why: str

    def __str__(self) -> str:
        return f"{self.label} acceptance ({self.why})"


def acceptance_kind(
    target: str | os.PathLike[str] | GGUFHeader,
    draft: str | os.PathLike[str] | GGUFHeader | None,
    synth_len: float | None = None,
) -> AcceptanceKind:
    """SYNTHETIC for llama.cpp's emulated acceptance (--spec-synth-len) and for pairs `dspark synth` wrote
    (scripted heads or random weights: their general.name says so); REAL otherwise."""
    if synth_len is not None:
        return AcceptanceKind("SYNTHETIC", f"--spec-synth-len {synth_len:g}: llama.cpp emulates acceptance")
    for role, path in (("draft", draft), ("target", target)):
        if path is None:
            continue
        name = str_of(open_header(path).get("general.name")) or ""
        if name.startswith(SYNTHETIC_NAME):
            return AcceptanceKind("SYNTHETIC", f"scripted pair: the {role} is {printable(name, 60)!r}")
    return AcceptanceKind("REAL", "a real draft on a real target")
