"""What a bench runs: the drafts, budgets and prompts of a plan, validated before any server starts,
and the files it runs on (resolved through ``pairs``, every draft checked against the target first)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import PLAIN
from dsparkcli.errors import UsageError
from dsparkcli.gguf.pairing import AcceptanceKind, acceptance_kind
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.placement import Placement
from dsparkcli.llama.protocol import AUTO, SPEC_N_MAX, SPEC_P_MIN
from dsparkcli.llama.server import ServerConfig
from dsparkcli.llama.speculation import Speculation
from dsparkcli.pairs import Downloads, PairSpec, check_given, check_pairing, resolve_files


@dataclass(frozen=True)
class Draft:
    label: str  # registry key or file stem: names the configuration
    path: Path


ADAPTIVE_LABEL = "adaptive"  # the adaptive arm's config name: "<draft>@adaptive"
AUTO_LABEL = "auto"  # --budget auto's arm when the tuning picked plain decoding: "<draft>@auto", no draft


@dataclass(frozen=True)
class Arm:
    """One server configuration: plain, one draft at one budget, or another speculation (``spec``: n-gram
    without a draft, draft-simple with its classic draft model as ``draft``)."""

    name: str
    draft: Draft | None = None
    budget: int | None = None
    spec: Speculation | None = None  # None: plain, or the DSpark draft (--spec-type draft-dspark)
    # per-arm settings (tune's cells differ in them); None: the plan's
    p_min: float | None = None
    synth_len: float | None = None
    synth_rates: tuple[float, ...] | None = None  # per-position synthetic acceptance, ``budget`` values
    # --budget adaptive: llama.cpp picks 0..budget per step from this cost table (--spec-draft-n-max auto)
    cost_table: Path | None = None
    # an arm whose server runs without the draft, as `dspark run/serve` then do: the adaptive arm of a table
    # where no draft can pay, the auto arm of a tuning where plain decoding won (budget.choice.AutoChoice)
    without_draft: bool = False
    # --budget auto per category: each request asks its category's tuned pick through dspark's per-request
    # speculative.n_max / p_min ((category, budget, p_min); budget 0: that category decodes without a draft)
    per_category: tuple[tuple[str, int, float], ...] = ()

    def request_fields(self, category: str) -> dict[str, int | float]:
        """The per-request draft settings of a prompt of ``category`` (none: the server's own)."""
        for c, k, p in self.per_category:
            if c == category:
                return {SPEC_N_MAX: k, SPEC_P_MIN: p}
        return {}

    @property
    def adaptive(self) -> bool:
        return self.cost_table is not None

    @property
    def plain(self) -> bool:
        return self.draft is None and self.spec is None

    @property
    def speculates(self) -> bool:
        """Its server drafts (a draft model or n-gram), so it has /metrics counters and identity to check."""
        return not self.plain and not self.without_draft

    @property
    def draft_label(self) -> str | None:
        """The records' ``draft``: the draft's label, or an n-gram speculation's (``ngram-mod``)."""
        return self.draft.label if self.draft else (self.spec.label if self.spec else None)

    def settings(self, plan: BenchPlan) -> tuple[float | None, float | None, tuple[float, ...] | None]:
        """(p_min, synth_len, synth_rates) this arm's server runs with: draft-only, the arm's over the plan's."""
        if self.draft is None:
            return None, None, None
        if self.synth_rates is not None:
            return (self.p_min if self.p_min is not None else plan.p_min), None, self.synth_rates
        return (
            self.p_min if self.p_min is not None else plan.p_min,
            self.synth_len if self.synth_len is not None else plan.synth_len,
            None,
        )

    def synth_mean(self, plan: BenchPlan) -> float | None:
        """The arm's synthetic mean acceptance length (None: real acceptance)."""
        _, length, rates = self.settings(plan)
        return 1.0 + sum(rates) if rates is not None else length


@dataclass(frozen=True)
class BenchPlan:
    target: Path
    drafts: tuple[Draft, ...]
    budgets: tuple[int, ...]
    prompts: tuple[Prompt, ...]
    mmproj: Path | None = None
    reps: int = 3
    # the configurations run in turn this many times, ``reps`` each time (rep numbers continue), so a
    # machine that drifts during the run slows every configuration alike instead of the later ones
    rounds: int = 1
    warmup: int = 1
    n_predict: int = 256
    ctx: int | None = 4096
    p_min: float | None = None
    synth_len: float | None = None  # llama.cpp's emulated acceptance: every figure is then synthetic
    ignore_eos: bool = False
    seed: int = 0
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    upstream_acceptance: tuple[tuple[str, float], ...] = ()  # (category, upstream acceptance length)
    model_name: str | None = None
    scripted: str | None = None  # why the pair's own acceptance is synthetic (a `dspark synth` pair), if it is
    # --concurrency: clients in flight (llama-server -np N) per load level; empty: one request at a time
    concurrency: tuple[int, ...] = ()
    explicit_arms: tuple[Arm, ...] = ()  # instead of drafts x budgets (tune's cells)
    # --spec: other speculation beside (or instead of) the DSpark drafts: n-gram arms run at their own
    # limits, a draft-simple one (its model resolved: ``path``) at every budget, after the DSpark arms
    specs: tuple[Speculation, ...] = ()
    # the DSpark drafts' own arms ("<draft>@<budget>"); False where --spec lists only chains that end with dspark
    dspark_arms: bool = True
    with_plain: bool = True  # plain decoding first (speedups and identity need it)
    placement: Placement = Placement()  # RPC workers, multi-GPU split, the draft's device: every arm the same
    # --budget adaptive: one more arm per draft, "<draft>@adaptive", on this cost table (its max k the cap)
    cost_table: Path | None = None
    adaptive_k: int = 0  # the cost table's largest k
    adaptive_without_draft: bool = False  # the table leaves no draft worth loading (Arm.without_draft)
    # --budget auto where the tuning found plain decoding fastest: the first draft's "<draft>@auto" arm runs
    # without it, as `dspark run --budget auto` then does
    auto_without_draft: bool = False
    # --budget auto where the tuning picked a budget for some categories: the first draft's "<draft>@auto" arm
    # serves each prompt its category's pick (Arm.per_category) on a server at the largest of them
    auto_per_category: tuple[tuple[str, int, float], ...] = ()

    def _validate_arms(self) -> None:
        names = [a.name for a in self.explicit_arms]
        if len(set(names)) != len(names) or PLAIN in names:
            raise UsageError("arm names must be distinct and not 'plain'")
        for a in self.explicit_arms:
            if a.spec is not None and a.draft is None:  # an n-gram arm (tune --methods): its own limits
                continue
            if a.draft is None or a.budget is None or a.budget < 1:
                raise UsageError(f"arm {a.name} needs a draft and a budget >= 1")
            p_min, length, rates = a.settings(self)
            if p_min is not None and not 0.0 <= p_min <= 1.0:
                raise UsageError(f"arm {a.name}: p_min must be within [0, 1] (got {p_min})")
            if length is not None and not 1.0 <= length <= a.budget + 1:
                raise UsageError(f"arm {a.name}: synthetic length must be within [1, {a.budget + 1}] (got {length})")
            if rates is not None and len(rates) != a.budget:
                raise UsageError(f"arm {a.name}: {len(rates)} synthetic rates for budget {a.budget}")

    @property
    def emulated(self) -> bool:
        """Some arm runs with llama.cpp's emulated acceptance (tune's cells: --spec-synth-len/-rates)."""
        return any(a.synth_mean(self) is not None for a in self.explicit_arms)

    @property
    def synthetic(self) -> bool:
        return self.synth_len is not None or self.scripted is not None or self.emulated

    @property
    def acceptance(self) -> AcceptanceKind:
        if self.synth_len is not None:
            return AcceptanceKind("SYNTHETIC", f"--spec-synth-len {self.synth_len:g}: llama.cpp emulates acceptance")
        if self.emulated:
            return AcceptanceKind(
                "SYNTHETIC", "--spec-synth-len/--spec-synth-rates cells: llama.cpp emulates acceptance"
            )
        return (
            AcceptanceKind("SYNTHETIC", self.scripted)
            if self.scripted
            else AcceptanceKind("REAL", "a real draft on a real target")
        )

    def arms(self) -> list[Arm]:
        arms = [Arm(PLAIN)] if self.with_plain else []
        if self.explicit_arms:
            return arms + list(self.explicit_arms)
        for d in self.drafts:
            arms += [Arm(f"{d.label}@{b}", d, b) for b in self.budgets] if self.dspark_arms else []
            if self.cost_table is not None:
                arms.append(
                    Arm(
                        f"{d.label}@{ADAPTIVE_LABEL}",
                        d,
                        self.adaptive_k,
                        cost_table=self.cost_table,
                        without_draft=self.adaptive_without_draft,
                    )
                )
            if self.auto_without_draft and d == self.drafts[0]:
                arms.append(Arm(f"{d.label}@{AUTO_LABEL}", d, None, without_draft=True))
            elif self.auto_per_category and d == self.drafts[0]:
                arms.append(
                    Arm(
                        f"{d.label}@{AUTO_LABEL}",
                        d,
                        max(k for _, k, _ in self.auto_per_category),
                        per_category=self.auto_per_category,
                    )
                )
        for s in self.specs:
            if s.uses_dspark:  # a chain ending with DSpark: every DSpark draft at every budget
                for d in self.drafts:
                    label = s.label if len(self.drafts) == 1 else f"{s.label}:{d.label}"
                    arms += [Arm(f"{label}@{b}", Draft(label, d.path), b, spec=s) for b in self.budgets]
            elif s.uses_model:
                assert s.path is not None, "a draft-simple speculation's model is resolved before the plan"
                arms += [Arm(f"{s.label}@{b}", Draft(s.label, s.path), b, spec=s) for b in self.budgets]
            else:
                arms.append(Arm(s.label, spec=s))
        return arms

    @property
    def model_drafts(self) -> bool:
        """Some arm runs a draft model at the plan's budgets (a DSpark draft or a classic one)."""
        return bool(self.drafts) or any(s.uses_model for s in self.specs)

    def server_config(self, arm: Arm, concurrency: int = 1) -> ServerConfig:
        """The llama-server configuration of one arm (the tuning key of tune and bench comes from it too)."""
        if arm.without_draft:
            return self.server_config(replace(arm, without_draft=False), concurrency).without_draft()
        p_min, synth_len, synth_rates = arm.settings(self)  # the arm's own (tune's cells), else the plan's
        return ServerConfig(
            model=self.target,
            draft=arm.draft.path if arm.draft else None,
            mmproj=self.mmproj,
            spec_type=arm.spec.spec_type if arm.spec else None,
            spec_flags=arm.spec.flags() if arm.spec else (),
            type_stats=arm.spec is not None and arm.spec.is_chain,  # which type of the chain proposed
            n_max=AUTO if arm.adaptive else arm.budget,
            cost_table=arm.cost_table,
            p_min=p_min,
            synth_len=synth_len,
            synth_rates=synth_rates,
            # llama-server splits -c over its slots: every client gets plan.ctx
            ctx=self.ctx * concurrency if self.ctx else None,
            n_parallel=concurrency,
            threads=self.threads,
            placement=self.placement,
            extra_args=self.extra_args,
        )

    def total_requests(self) -> int:
        per_client = self.warmup + len(self.prompts) * self.reps
        if self.concurrency:  # every client asks the whole kit
            return len(self.arms()) * sum(self.concurrency) * per_client
        return len(self.arms()) * per_client * self.rounds

    def validate(self) -> None:
        self.placement.validate()
        if self.explicit_arms:
            self._validate_arms()
        elif not self.drafts and not self.specs:
            raise UsageError("bench needs at least one draft (--draft or --model) or --spec")
        elif (
            self.model_drafts
            and not self.budgets
            and self.cost_table is None
            and not self.auto_without_draft
            and not self.auto_per_category
        ):
            raise UsageError("bench needs at least one --budget")
        check_budget_values(self.budgets)
        labels = [d.label for d in self.drafts]
        if len(set(labels)) != len(labels):
            raise UsageError(f"two drafts share the label '{next(lb for lb in labels if labels.count(lb) > 1)}'")
        # the specific causes above first; what is left is two --spec values of one name
        names = [a.name for a in self.arms()]
        if len(set(names)) != len(names):
            raise UsageError(f"two configurations share the name '{next(n for n in names if names.count(n) > 1)}'")
        if any(c < 1 for c in self.concurrency):
            raise UsageError(f"--concurrency values must be >= 1 (got {', '.join(map(str, self.concurrency))})")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise UsageError("--concurrency values must be distinct")
        if self.reps < 1:
            raise UsageError("--reps must be at least 1")
        if self.rounds < 1:
            raise UsageError("--rounds must be at least 1")
        if self.rounds > 1 and self.concurrency:
            raise UsageError("--rounds is for one request at a time: a --concurrency run repeats passes (--reps)")
        if self.warmup < 0:
            raise UsageError("--warmup must be >= 0")
        if self.n_predict < 1:
            raise UsageError("--n-predict must be at least 1")
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise UsageError(f"--p-min must be within [0, 1] (got {self.p_min})")
        if self.synth_len is not None and not self.explicit_arms and self.budgets:
            worst = min(self.budgets)
            if not 1.0 <= self.synth_len <= worst + 1:
                raise UsageError(
                    f"--synth-len must be within [1, {worst + 1}] for budget {worst} (got {self.synth_len})"
                )
        if not self.prompts:
            raise UsageError("no prompts selected")
        if self.mmproj is None:
            vision = [p.id for p in self.prompts if p.has_images]
            if vision:
                raise UsageError(
                    f"{len(vision)} prompts have images (e.g. {vision[0]}) but no --mmproj was given",
                    hint="pass --mmproj, or --category text",
                )


@dataclass(frozen=True)
class BenchInputs:
    """The files a bench runs on, and what the registry says about them."""

    target: Path
    mmproj: Path | None
    drafts: tuple[Draft, ...]
    upstream_acceptance: tuple[tuple[str, float], ...] = ()
    budget: int | None = None  # the registry pair's default budget
    model_name: str | None = None
    scripted: str | None = None  # set when a draft or the target is a `dspark synth` pair (SYNTHETIC)


def scripted(target: Path, drafts: Sequence[Path]) -> str | None:
    """Why a run on this target with these draft files (DSpark or classic) is SYNTHETIC (a `dspark synth`
    file among them), or None; without drafts (n-gram speculation) the target alone decides."""
    for path in [*drafts] or [None]:
        kind = acceptance_kind(target, path)
        if kind.label == "SYNTHETIC":
            return kind.why
    return None


def check_budget_values(budgets: Sequence[int]) -> None:
    """The --budget numbers as given: each >= 1, none twice. Also before bench looks for an engine or the hub,
    so `--budget 0` is a usage error on a machine with no engine built (it was "no engine found")."""
    if any(b < 1 for b in budgets):
        raise UsageError(f"--budget must be >= 1 (got {', '.join(map(str, budgets))})")
    if len(set(budgets)) != len(budgets):
        twice = next(b for b in budgets if budgets.count(b) > 1)
        raise UsageError(f"--budget values must be distinct ({twice} is given twice)")


def check_given_inputs(*, model: str | None, target: str | None, drafts: Sequence[str], mmproj: str | None) -> None:
    """The user's files and hub addresses (pairs.check_given), before bench looks for an engine: a typo is said
    as the typo. Registry keys (``drafts`` without --target) are checked with the pair, in resolve_inputs."""
    if target is None:
        check_given(PairSpec(model=model, mmproj=mmproj))
        return
    for d in drafts or [None]:
        draft = None if d is None else _split_label(d)[1]
        check_given(PairSpec(model=model, target=target, draft=draft, mmproj=mmproj))


def _split_label(spec: str) -> tuple[str | None, str]:
    """``LABEL=PATH`` names a draft in tables; a bare path or registry key has no label."""
    label, sep, rest = spec.partition("=")
    if sep and label and rest and "/" not in label and not label.startswith("hf:"):
        return label, rest
    return None, spec


def _label(path: str, taken: set[str]) -> str:
    stem = Path(path).name.removesuffix(".gguf") or "draft"
    label, n = stem, 2
    while label in taken:
        label, n = f"{stem}-{n}", n + 1
    return label


def resolve_inputs(
    *,
    model: str | None,
    target: str | None,
    drafts: Sequence[str],
    mmproj: str | None,
    yes: bool = False,
    engine: Engine | None = None,
    on_notice: Callable[[str], None] | None = None,
    dspark: bool = True,
) -> BenchInputs:
    """Local paths (or hf:// refs) with --target, else the registry pair (``drafts``: keys or paths,
    each optionally ``LABEL=...`` to name its configurations).

    Every draft is checked against the target first: a wrong pair fails in one line, not as a
    llama.cpp assert in each configuration; so is every file against the ``engine``, before it is downloaded.
    ``dspark`` False (``--spec`` without dspark, no --draft): no DSpark draft, only the target (and mmproj).
    """
    downloads = Downloads(yes=yes, engine=engine, on_notice=on_notice)
    if not dspark and not drafts:
        files = resolve_files(PairSpec(model=model, target=target, mmproj=mmproj, no_draft=True), downloads)
        check_pairing(files, engine)
        if target is not None:
            return BenchInputs(
                target=files.target, mmproj=files.mmproj, drafts=(), scripted=scripted(files.target, [])
            )
        pair = load_registry().get(model)
        # no upstream acceptance: the registry's figures are its DSpark draft's
        return BenchInputs(
            target=files.target,
            mmproj=files.mmproj,
            drafts=(),
            budget=pair.budget,
            model_name=pair.name,
            scripted=scripted(files.target, []),
        )
    resolved: list[Draft] = []
    taken: set[str] = set()
    if target is not None:
        if model is not None:
            raise UsageError("give either --model or --target, not both")
        if not drafts:
            raise UsageError("--target needs at least one --draft")
        for spec in drafts:
            given, d = _split_label(spec)
            files = resolve_files(PairSpec(target=target, draft=d, mmproj=mmproj), downloads)
            check_pairing(files, engine)
            label = given or _label(d, taken)
            taken.add(label)
            resolved.append(Draft(label, files.draft))  # type: ignore[arg-type]
        return BenchInputs(
            target=files.target,
            mmproj=files.mmproj,
            drafts=tuple(resolved),
            scripted=scripted(files.target, [d.path for d in resolved]),
        )
    reg = load_registry()
    name = model or reg.default
    if name is None:
        raise UsageError("no --model given and the registry has no default pair; pass --target and --draft")
    pair = reg.get(name)
    if not drafts and not pair.drafts:
        raise UsageError(f"{name} has no DSpark draft to bench; give a draft file with --draft")
    for spec in drafts or [pair.default_draft]:
        given, d = _split_label(spec)
        if d in pair.drafts:  # model None: the default pair, announced by resolve_files
            files = resolve_files(PairSpec(model=model, draft_key=d, mmproj=mmproj), downloads)
            label = given or d
        else:
            files = resolve_files(PairSpec(model=model, draft=d, mmproj=mmproj), downloads)
            label = given or _label(d, taken)
        if files.draft is None:
            raise UsageError(f"pair {name} has no draft '{d}' (known: {', '.join(pair.drafts)})")
        check_pairing(files, engine)
        taken.add(label)
        resolved.append(Draft(label, files.draft))
    return BenchInputs(
        target=files.target,
        mmproj=files.mmproj,
        drafts=tuple(resolved),
        upstream_acceptance=tuple(pair.acceptance.items()),
        budget=pair.budget,
        model_name=name,
        scripted=scripted(files.target, [d.path for d in resolved]),
    )
