"""`tune --methods`: which speculation methods a tuning measures and picks from per category, beside the
DSpark budget it always tunes. Pure.

A method is ``plain`` (no draft), ``dspark`` (the DSpark draft at the budget tune picks for the category), an
n-gram type (``ngram-mod``, with its options) or a chain that the n-gram types lead (``ngram-mod+dspark``:
measured at tune's overall DSpark pick, its label then ``ngram-mod+dspark@3``). tune measures the n-gram and
chain methods in its verification run, beside plain and the DSpark candidates, so every speedup of a
category comes from one run; the pick is the fastest measured (``pick``: the simpler within 2 %), as tune picks a budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dsparkcli.budget.model import Choice
from dsparkcli.errors import UsageError
from dsparkcli.llama.speculation import DEFAULT_METHODS, DSPARK, PLAIN, Speculation, parse


def parse_methods(texts: Sequence[str] | None) -> tuple[str, ...]:
    """``--methods`` values -> their labels (``plain``, ``dspark``, a --spec label), in the order given; the
    default set for none. UsageError: an unknown or repeated method, a classic draft model (tune measures the
    pair's own draft only)."""
    labels: list[str] = []
    for text in texts or DEFAULT_METHODS:
        word = text.strip().lower()
        if word in (PLAIN, DSPARK):
            label = word
        else:
            s = parse(text)
            assert s is not None  # "dspark" alone is handled above
            if s.uses_model:
                raise UsageError(f"--methods {text!r}: tune measures the pair's own DSpark draft, not a classic one")
            label = s.label
        if label in labels:
            raise UsageError(f"--methods {text!r}: {label} given twice")
        labels.append(label)
    return tuple(labels)


def speculation_of(label: str) -> Speculation | None:
    """The speculation a measured method label runs (``ngram-mod+dspark@3``: the chain, without its budget);
    None for plain and dspark."""
    name = label.rpartition("@")[0] if "@" in label and "+" in label else label
    if name in (PLAIN, DSPARK) or name.startswith(DSPARK + "@"):
        return None
    return parse(name)


def budget_of(label: str) -> int | None:
    """A chain's measured budget (``ngram-mod+dspark@3`` -> 3); None for a method without one."""
    _, at, k = label.rpartition("@")
    return int(k) if at and k.isdigit() else None


# a method replaces a simpler one (listed earlier: plain, dspark, then as given) only when it measured more than
# this much faster: within it, the difference is a loaded machine's noise, and the simpler server wins
MARGIN = 0.02


def pick(measured: Sequence[tuple[str, float]]) -> tuple[str, float] | None:
    """The (method label, speedup over plain) of one category: the first listed within MARGIN of the fastest."""
    if not measured:
        return None
    best = max(x for _, x in measured)
    return next((label, x) for label, x in measured if x * (1.0 + MARGIN) >= best)


def picks(
    methods: Sequence[str],
    choices: Iterable[Choice],
    measured: Sequence[tuple[str, str, float]],
) -> tuple[tuple[tuple[str, str, float], ...], tuple[tuple[str, str], ...]]:
    """(every method's speedup per category, the pick per category) from tune's budget ``choices`` (the
    ``dspark`` method: the category's DSpark pick, its measured speedup, else its predicted one; none where
    plain won the budgets) and the verification run's ``measured`` (category, arm name, speedup) of the
    n-gram and chain arms. ``plain`` is 1.0 by definition."""
    rows: list[tuple[str, str, float]] = []
    chosen: list[tuple[str, str]] = []
    for choice in choices:
        cat, options = choice.category, []
        if PLAIN in methods:
            options.append((PLAIN, 1.0))
        gain = choice.measured if choice.measured is not None else choice.predicted
        if DSPARK in methods and choice.candidate is not None and gain is not None:
            options.append((DSPARK, gain))
        options += [(name, x) for c, name, x in measured if c == cat]
        best = pick(options)
        if best is not None:
            rows += [(cat, name, x) for name, x in options]
            chosen.append((cat, best[0]))
    return tuple(rows), tuple(chosen)
