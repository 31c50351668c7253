"""`--spec`: which speculation a server runs, besides dspark's own DSpark draft: llama.cpp's n-gram
speculation (no draft model) and a classic draft model (draft-simple), what a user would pick instead.

Standard library only (the CLI's option parsing reads it). ``parse`` turns ``ngram-mod:n_max=8`` or
``draft-simple:qwen2.5-coder-0.5b`` into a ``Speculation``; ``flags`` gives the llama-server flags it sets
(common/arg.cpp of the pinned llama.cpp), which are then dspark's (``llama.flags.OWNED_FLAGS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import UsageError

DSPARK = "dspark"  # the DSpark draft (--spec-type draft-dspark): the default of run, serve and bench
DRAFT_SIMPLE = "draft-simple"  # a classic draft model of the target's family (-md, --spec-draft-n-max)
NGRAM_MOD = "ngram-mod"
NGRAM_SIMPLE = "ngram-simple"

# each n-gram type's options -> its llama-server flag and the bounds common/arg.cpp accepts. ``n_max`` is
# the most tokens one draft holds for both (ngram-simple calls it the m-gram size, --spec-ngram-simple-size-m);
# they are the n-gram type's own limits: a request's speculative.n_max does not cap them (patch 0001).
NGRAM_OPTIONS: dict[str, dict[str, tuple[str, int, int]]] = {
    NGRAM_MOD: {
        "n_max": ("--spec-ngram-mod-n-max", 0, 1024),
        "n_min": ("--spec-ngram-mod-n-min", 0, 1024),
        "n_match": ("--spec-ngram-mod-n-match", 1, 1024),
    },
    NGRAM_SIMPLE: {
        "n_max": ("--spec-ngram-simple-size-m", 1, 1024),
        "size_n": ("--spec-ngram-simple-size-n", 1, 1024),
        "min_hits": ("--spec-ngram-simple-min-hits", 1, 1 << 30),
    },
}
# llama.cpp's defaults (common/common.h), for the docs and the help: what a bare type runs with
NGRAM_DEFAULTS = {NGRAM_MOD: "n_max=64, n_min=48, n_match=24", NGRAM_SIMPLE: "n_max=48, size_n=12, min_hits=1"}

KINDS = (DSPARK, NGRAM_MOD, NGRAM_SIMPLE, DRAFT_SIMPLE)
SPEC_HELP = (
    "Speculation: dspark (the DSpark draft, default), ngram-mod or ngram-simple (llama.cpp's n-gram "
    "drafting, no draft model; options after a colon: ngram-mod:n_max=8,n_min=4), draft-simple[:MODEL] "
    "(a classic draft model by registry name or path; default: the pair's classic draft)."
)


@dataclass(frozen=True)
class Speculation:
    """One speculation type other than DSpark: an n-gram type with its options, or draft-simple with its
    model (as given: a registry pair's name or a path; ``path``: the file it resolved to)."""

    kind: str
    options: tuple[tuple[str, int], ...] = ()  # n-gram options in the order given
    model: str | None = None
    path: Path | None = None

    @property
    def uses_model(self) -> bool:
        """A draft model runs (its draft capped by --budget / a request's speculative.n_max)."""
        return self.kind == DRAFT_SIMPLE

    @property
    def label(self) -> str:
        """The configuration's name in tables and records: ``ngram-mod``, ``ngram-mod:n_max=8``,
        ``draft-simple:qwen2.5-coder-0.5b`` (a path by its file stem)."""
        if self.uses_model:
            name = self.model or "classic"
            if "/" in name or name.endswith(".gguf"):
                name = Path(name).name.removesuffix(".gguf")
            return f"{self.kind}:{name}"
        return self.kind + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")

    def flags(self) -> tuple[tuple[str, int], ...]:
        """The n-gram flags and values this speculation sets (draft-simple's are ServerConfig's own)."""
        table = NGRAM_OPTIONS.get(self.kind, {})
        return tuple((table[k][0], v) for k, v in self.options)


def parse(text: str) -> Speculation | None:
    """``--spec`` text -> a Speculation; None for ``dspark`` (the DSpark draft). UsageError names what is
    wrong: an unknown type or option, a value out of llama.cpp's bounds."""
    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UsageError(f"--spec {text!r}: unknown speculation '{kind}' (known: {', '.join(KINDS)})")
    if kind == DSPARK:
        if rest:
            raise UsageError(f"--spec {text!r}: dspark takes no options (its budget is --budget)")
        return None
    if kind == DRAFT_SIMPLE:
        if sep and not rest.strip():
            raise UsageError(f"--spec {text!r}: give the classic draft model after the colon, or nothing")
        return Speculation(kind, model=rest.strip() or None)
    table = NGRAM_OPTIONS[kind]
    options: list[tuple[str, int]] = []
    for item in (p.strip() for p in rest.split(",")) if rest.strip() else ():
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in table or not eq:
            raise UsageError(f"--spec {text!r}: {kind} takes {', '.join(f'{k}=N' for k in table)} (got {item!r})")
        try:
            number = int(value)
        except ValueError:
            raise UsageError(f"--spec {text!r}: {key} must be an integer (got {value!r})") from None
        _, low, high = table[key]
        if not low <= number <= high:
            raise UsageError(f"--spec {text!r}: {key} must be within [{low}, {high}] (got {number})")
        if any(k == key for k, _ in options):
            raise UsageError(f"--spec {text!r}: {key} given twice")
        options.append((key, number))
    given = dict(options)
    if kind == NGRAM_SIMPLE and given.get("n_max", 48) < given.get("size_n", 12):
        # common/ngram-map.cpp: a draft shorter than the looked-up n-gram is dropped, so it would never draft
        raise UsageError(
            f"--spec {text!r}: ngram-simple drafts only when n_max >= size_n "
            f"(n_max {given.get('n_max', 48)}, size_n {given.get('size_n', 12)})"
        )
    # ngram-mod's n_min above its n_max is llama.cpp's own rule: a lookup that stops before n_min tokens
    # drafts nothing, one that reaches n_max drafts n_max (n_max=8 with the default n_min 48: 8 or none)
    return Speculation(kind, tuple(options))


def owned_flags() -> dict[str, str]:
    """The n-gram flags ``--spec`` sets, for OWNED_FLAGS: given after ``--`` they would change a run dspark
    labels with other settings."""
    return {
        flag: f"--spec {kind}:{key}=N" for kind, table in NGRAM_OPTIONS.items() for key, (flag, _, _) in table.items()
    }
