"""What a budget may be, pure and written once for run, serve, bench and tune: the ``--budget`` text (a
number, ``auto``, ``adaptive``), and the range a draft allows. A DSpark block of B positions proposes at
most B − 1 tokens a step (B with a bonus anchor: ``gguf.analysis.dspark_structure.max_spec_draft_n``);
llama.cpp clamps a larger budget silently, so a given one is refused, and a default one (the registry's,
or DEFAULT_BUDGET) is clamped and said so: the user never asked for it.

Standard library only (``cli._common`` parses --budget with it at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsparkcli.errors import UsageError

AUTO = "auto"  # --budget auto: the stored tuning's pick
ADAPTIVE = "adaptive"  # --budget adaptive: llama.cpp picks each step's budget (dspark's patch series)


def parse_auto(value: str | None, what: str, cast: type, *, adaptive: bool = False) -> tuple[object | None, bool]:
    """``--budget``/``--p-min`` text -> (value, auto): a number, 'auto', or nothing; with ``adaptive``,
    'adaptive' comes back as the value ADAPTIVE."""
    if value is None:
        return None, False
    if value.strip().lower() == AUTO:
        return None, True
    if adaptive and value.strip().lower() == ADAPTIVE:
        return ADAPTIVE, False
    try:
        return cast(value), False
    except ValueError:
        choices = "a number, 'auto' or 'adaptive'" if adaptive else "a number or 'auto'"
        raise UsageError(f"{what} must be {choices} (got {value!r})") from None


@dataclass(frozen=True)
class DraftLimit:
    """The budgets a draft can honour: 1..``most`` (None: its header does not say)."""

    name: str  # the draft's file name, for messages
    most: int | None = None
    block: int | None = None

    def _most(self) -> str:
        return f"at most {self.most} (block size {self.block}, {self.name})"

    def check(self, budget: int, what: str = "--budget") -> None:
        """A budget the user gave: refused in one line when the draft cannot honour it."""
        if budget < 1:
            raise UsageError(f"{what} must be >= 1 (got {budget})")
        if self.most is not None and budget > self.most:
            raise UsageError(f"{what} {budget} is above what the draft proposes per step: {self._most()}")

    def fit_default(self, default: int) -> tuple[int, str | None]:
        """A budget nobody gave (the registry's or DEFAULT_BUDGET): clamped to the draft, with the line that
        says so (None when it fits)."""
        if self.most is not None and default > self.most:
            return self.most, (
                f"budget {self.most}: the default {default} is more than the draft proposes per "
                f"step, {self._most()} (--budget N sets it)"
            )
        return default, None
