"""`--spec`: which speculation a server runs, besides dspark's own DSpark draft: llama.cpp's n-gram
speculation (no draft model) and a classic draft model (draft-simple), what a user would pick instead, and
chains of them (``ngram-mod+dspark``: one server with both, ``--spec-type ngram-mod,draft-dspark``).

Standard library only (the CLI's option parsing reads it). ``parse`` turns ``ngram-mod:n_max=8``,
``draft-simple:qwen2.5-coder-0.5b`` or ``ngram-mod+dspark`` into a ``Speculation``; ``flags`` gives the
llama-server flags it sets (common/arg.cpp of the pinned llama.cpp), which are then dspark's
(``llama.flags.OWNED_FLAGS``).

A chain is llama.cpp's own: ``--spec-type`` takes a list, ``common_speculative_init`` orders the n-gram types
first (ngram-simple, then ngram-mod) and a draft model after, and each step drafts with the first type that
proposes a draft (``common_speculative_draft``). dspark takes a chain only in that order, so its label says
what llama.cpp tries first; a request's budget caps the draft model's draft only (patch 0001).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli.errors import UsageError

DSPARK = "dspark"  # the DSpark draft (--spec-type draft-dspark): the default of run, serve and bench
DRAFT_DSPARK = "draft-dspark"  # llama.cpp's name of the DSpark type
CHAIN = "+"  # ngram-mod+dspark: the types of one server, in the order llama.cpp tries them
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
MODEL_KINDS = (DSPARK, DRAFT_SIMPLE)  # types that run a draft model (at most one per server)
# the order common_speculative_init tries the types in (common/speculative.cpp): n-gram first, the model last
TRIAL_ORDER = (NGRAM_SIMPLE, NGRAM_MOD, DSPARK, DRAFT_SIMPLE)
SPEC_HELP = (
    "Speculation: dspark (the DSpark draft, default), ngram-mod or ngram-simple (llama.cpp's n-gram "
    "drafting, no draft model; options after a colon: ngram-mod:n_max=8,n_min=4), draft-simple[:MODEL] "
    "(a classic draft model by registry name or path; default: the pair's classic draft), or a chain "
    "joined by '+', n-gram types first (ngram-mod+dspark: n-gram drafts where the text repeats, DSpark "
    "elsewhere)."
)

# tune --methods (budget.methods picks among them): plain decoding, the DSpark draft, an n-gram type or a chain.
# Here, not in budget.methods, because the CLI's help reads it at start-up (standard library only).
PLAIN = "plain"
DEFAULT_METHODS = (PLAIN, DSPARK, NGRAM_MOD, f"{NGRAM_MOD}+{DSPARK}")
METHODS_HELP = (
    "Speculation methods tune measures and picks from per category: plain, dspark (at the budget tune picks), "
    "an n-gram type (ngram-mod[:opts]) or a chain (ngram-mod+dspark, at tune's overall budget). "
    f"Default: {' '.join(DEFAULT_METHODS)}."
)


@dataclass(frozen=True)
class Speculation:
    """One speculation type other than DSpark: an n-gram type with its options, or draft-simple with its
    model (as given: a registry pair's name or a path; ``path``: the file it resolved to)."""

    kind: str  # DSPARK only as the end of a chain (alone, dspark is parse()'s None)
    options: tuple[tuple[str, int], ...] = ()  # n-gram options in the order given
    model: str | None = None
    path: Path | None = None
    # a chain: the n-gram types llama.cpp tries before this one, each a Speculation of its own (no chain)
    ngrams: tuple[Speculation, ...] = ()

    @property
    def uses_model(self) -> bool:
        """A classic draft model runs (draft-simple, alone or ending a chain; its draft capped by --budget / a
        request's speculative.n_max): its model is resolved as the pair's classic draft."""
        return self.kind == DRAFT_SIMPLE

    @property
    def uses_dspark(self) -> bool:
        """A chain that ends with the DSpark draft (``ngram-mod+dspark``): the pair's DSpark draft is loaded
        and --budget caps its drafts, as for dspark alone."""
        return self.kind == DSPARK

    @property
    def is_chain(self) -> bool:
        return bool(self.ngrams)

    @property
    def types(self) -> tuple[str, ...]:
        """llama.cpp's type names, in the order it tries them: ``--spec-type``'s list."""
        return tuple(n.kind for n in self.ngrams) + (DRAFT_DSPARK if self.uses_dspark else self.kind,)

    @property
    def spec_type(self) -> str:
        """``--spec-type``'s value: ``ngram-mod``, ``ngram-mod,draft-dspark``."""
        return ",".join(self.types)

    @property
    def label(self) -> str:
        """The configuration's name in tables and records: ``ngram-mod``, ``ngram-mod:n_max=8``,
        ``draft-simple:qwen2.5-coder-0.5b`` (a path by its file stem), ``ngram-mod+dspark``."""
        if self.ngrams:
            return CHAIN.join([*(n.label for n in self.ngrams), replace(self, ngrams=()).label])
        if self.uses_dspark:
            return DSPARK
        if self.uses_model:
            name = self.model or "classic"
            if "/" in name or name.endswith(".gguf"):
                name = Path(name).name.removesuffix(".gguf")
            return f"{self.kind}:{name}"
        return self.kind + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")

    def flags(self) -> tuple[tuple[str, int], ...]:
        """The n-gram flags and values this speculation sets, a chain's n-gram types' in order (draft-simple's
        and DSpark's are ServerConfig's own)."""
        table = NGRAM_OPTIONS.get(self.kind, {})
        own = tuple((table[k][0], v) for k, v in self.options)
        return tuple(f for n in self.ngrams for f in n.flags()) + own


def parse(text: str) -> Speculation | None:
    """``--spec`` text -> a Speculation; None for ``dspark`` (the DSpark draft). UsageError names what is
    wrong: an unknown type or option, a value out of llama.cpp's bounds, a chain of two draft models, a type
    twice, a chain out of llama.cpp's order."""
    parts = text.split(CHAIN)
    if len(parts) == 1:
        return _parse_one(text, text)
    if any(not p.strip() for p in parts):
        raise UsageError(f"--spec {text!r}: an empty type in the chain (join types with '+': ngram-mod+dspark)")
    kinds = [p.strip().partition(":")[0].strip().lower() for p in parts]
    for kind in kinds:
        if kind not in KINDS:
            raise UsageError(f"--spec {text!r}: unknown speculation '{kind}' (known: {', '.join(KINDS)})")
    twice = next((k for k in kinds if kinds.count(k) > 1), None)
    if twice is not None:
        raise UsageError(f"--spec {text!r}: {twice} given twice in one chain")
    models = [k for k in kinds if k in MODEL_KINDS]
    if len(models) > 1:
        raise UsageError(f"--spec {text!r}: a chain of two draft models ({' and '.join(models)}); one server runs one")
    in_order = sorted(range(len(parts)), key=lambda i: TRIAL_ORDER.index(kinds[i]))
    if in_order != list(range(len(parts))):
        spelled = CHAIN.join(parts[i].strip() for i in in_order)
        raise UsageError(
            f"--spec {text!r}: llama.cpp tries n-gram types first (ngram-simple, ngram-mod), a draft model last: "
            f"write {spelled}"
        )
    # ngram types parse as themselves; the last part may be dspark (a marker here: parse_one gives None)
    ngrams = tuple(_parse_one(text, p) for p in (parts[:-1] if models else parts))
    if models:
        last = _parse_one(text, parts[-1]) or Speculation(DSPARK)
    else:
        *ngrams, last = ngrams  # type: ignore[assignment]
        ngrams = tuple(ngrams)
    assert last is not None and all(n is not None for n in ngrams)
    return replace(last, ngrams=ngrams)  # type: ignore[arg-type]


def _parse_one(text: str, part: str) -> Speculation | None:
    """One type of ``text`` (``part``: all of it, or one link of a chain); None for dspark."""
    kind, sep, rest = part.strip().partition(":")
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
