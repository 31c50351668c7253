"""Stored tunings: the key of a pair as served (file sha256s, engine commit, backend, GPU, cost-changing
flags), the record store under the dspark cache, and ``--budget auto`` / ``--p-min auto`` / ``--budget
adaptive`` for run, serve and bench. Light: no bench machinery, so `run` pays nothing for it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli import config
from dsparkcli.bench import provenance, tune
from dsparkcli.bench.tune import TuningKey, TuningRecord
from dsparkcli.errors import EngineCapabilityError, UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import budget as budget_mod
from dsparkcli.llama import protocol
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import ServerConfig


# ------------------------------------------------------------------ the key and the store


def key_for(engine: Engine, target: Path, draft: Path, server_argv: Sequence[str]) -> TuningKey:
    """The tuning key of a pair served with this argv (file sha256s are cached, see bench.provenance)."""
    if not (engine.backend and engine.commit):
        engine = engine_mod.describe(engine)  # an engine found but not yet asked: the same key either way
    build = provenance.build_record(engine)
    commit = engine.commit or (str(build.get("commit", "")) if build else "")
    gpus = provenance.gpu_names()
    return TuningKey(target_sha256=provenance.file_facts(target).sha256,
                     draft_sha256=provenance.file_facts(draft).sha256, engine_commit=commit,
                     backend=engine.backend or "", gpu=", ".join(gpus) if gpus else "none",
                     flags=tune.cost_flags(server_argv))


def store_dir() -> Path:
    return config.cache_dir() / "tuning"


def save(record: TuningRecord, path: Path | None = None) -> Path:
    """Write atomically (a reader never sees half a record): ``<cache>/tuning/<key id>.json`` by default."""
    path = path or store_dir() / f"{record.key.id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning.", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record.to_record(), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load(path: Path) -> TuningRecord:
    try:
        return TuningRecord.from_record(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"tuning record not found: {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"not a dspark tuning record: {path}: {e}") from None


def stored() -> list[TuningRecord]:
    """Every readable stored record (a damaged one is skipped: it only costs a re-tune)."""
    out = []
    for path in sorted(store_dir().glob("*.json")):
        try:
            out.append(load(path))
        except UsageError:
            continue
    return out


def find(key: TuningKey) -> TuningRecord | None:
    rec = next((r for r in stored() if r.key == key), None)
    return rec if rec is not None and rec.complete else None


@dataclass(frozen=True)
class AutoChoice:
    budget: int | None  # None: no tuning matched (the caller's default applies)
    p_min: float | None
    plain: bool  # the tuning says plain decoding beats every budget
    message: str  # one line for the user
    record: TuningRecord | None = None
    cost_table: Path | None = None  # --budget adaptive: the table llama.cpp chooses each step's budget from
    # --budget adaptive on a table where no draft length can pay even with every drafted token accepted
    # (llama.budget.best_case <= 1): the engine would choose k = 0 at every step of every request, and a
    # fixed budget of the table's lengths would only be slower, so the server runs without the draft
    without_draft: bool = False


def auto_settings(engine: Engine, cfg: ServerConfig, category: str | None, default_budget: int) -> AutoChoice:
    """``--budget auto``: the stored choice for this pair, engine, machine and flags (and category)."""
    assert cfg.draft is not None
    key = key_for(engine, cfg.model, cfg.draft, cfg.argv(engine.server, 0))
    rec = find(key)
    where = f" for category {category}" if category else ""
    if rec is None:
        same_pair = [r for r in stored() if (r.key.target_sha256, r.key.draft_sha256)
                     == (key.target_sha256, key.draft_sha256) and r.complete]
        why = (f" (tuned with other settings: {', '.join(key.differences(same_pair[0].key))})" if same_pair
               else " (run `dspark tune` with the same pair and flags)")
        return AutoChoice(None, None, False, f"no tuning matches this pair, engine and flags{why}; "
                                             f"using budget {default_budget}")
    choice = rec.choice(category)
    if choice is None:
        return AutoChoice(None, None, False, f"the tuning {rec.key.id} has no category {category} "
                          f"(has {', '.join(rec.categories)}); using budget {default_budget}", rec)
    if choice.candidate is None:
        return AutoChoice(None, None, True, f"tuning {rec.key.id}{where}: no budget beat plain decoding "
                          f"(consider --no-draft); using budget {default_budget}", rec)
    c = choice.candidate
    gain = choice.measured if choice.measured is not None else choice.predicted
    return AutoChoice(c.budget, c.p_min, False, f"tuning {rec.key.id}{where}: budget {c.budget}"
                      + (f", p-min {c.p_min:g}" if c.p_min else "") + (f" ({gain:.2f}x plain)" if gain else ""), rec)


ADAPTIVE = "adaptive"  # --budget adaptive: llama.cpp chooses each step's budget (dspark's patch series)


def require_adaptive(engine: Engine) -> None:
    """--budget adaptive needs dspark's patched llama.cpp; say how to get it before anything starts."""
    if not engine_mod.capabilities(engine).adaptive_budget:
        raise EngineCapabilityError(f"{engine.server} has no --spec-cost-table: --budget adaptive needs dspark's "
                                    "patched llama.cpp", hint="dspark engine build (patches are applied by default)")


def write_cost_table(rec: TuningRecord) -> Path:
    """The tuning's cost model as llama.cpp's ``--spec-cost-table`` file, next to the record (atomic)."""
    path = store_dir() / f"{rec.key.id}.cost.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cost.", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(tune.cost_table(rec.cost))
    os.replace(tmp, path)
    return path


def adaptive_settings(engine: Engine, cfg: ServerConfig, default_budget: int) -> AutoChoice:
    """``--budget adaptive``: the cost table of the stored tuning for this pair, engine, machine and flags
    (its acceptance is the engine's own, per request); without one, the default budget, said in one line."""
    assert cfg.draft is not None
    require_adaptive(engine)
    rec = find(key_for(engine, cfg.model, cfg.draft, cfg.argv(engine.server, 0)))
    if rec is None or not rec.cost.t_step_ms or rec.cost.t1_ms <= 0:
        return AutoChoice(None, None, False, "--budget adaptive needs this pair's cost table and no tuning matches "
                          f"this pair, engine and flags (run `dspark tune` first); using budget {default_budget}")
    path = write_cost_table(rec)
    ks = [k for k, _ in rec.cost.t_step_ms]
    message = (f"adaptive budget: llama.cpp picks 0..{max(ks)} per step from tuning {rec.key.id}'s step costs "
               f"(measured at k = {', '.join(map(str, ks))})")
    k, best = budget_mod.best_case(budget_mod.parse_cost_table(path.read_text(encoding="utf-8"), str(path)))
    if best <= 1.0:  # the engine would choose k = 0 at every step, whatever the acceptance
        message += (f"; on these step costs no draft can pay even with every token accepted (best: k = {k}, "
                    f"{best:.2f}x plain), so the draft is not loaded and every request decodes as plain does "
                    "(--budget N keeps it)")
        return AutoChoice(None, None, True, message, rec, path, without_draft=True)
    return AutoChoice(None, None, False, message, rec, path)


def apply_auto(engine: Engine, cfg: ServerConfig, *, budget: bool, p_min: bool,
               category: str | None = None, adaptive: bool = False) -> tuple[ServerConfig, AutoChoice | None]:
    """The server configuration with the stored budget and/or p-min put in (when a tuning matches);
    the message says what was used either way. Plain decoding configurations are returned unchanged.
    ``adaptive``: ``--spec-draft-n-max auto`` with the tuning's cost table instead of a fixed budget."""
    if cfg.draft is None or not (budget or p_min or adaptive):
        return cfg, None
    if adaptive:
        choice = adaptive_settings(engine, cfg, cfg.n_max if isinstance(cfg.n_max, int) else 0)
        if choice.without_draft:
            return cfg.without_draft(), choice
        if choice.cost_table is not None:
            cfg = replace(cfg, n_max=protocol.AUTO, cost_table=choice.cost_table)
        if p_min:
            cfg, auto_p = apply_auto(engine, cfg, budget=False, p_min=True, category=category)
            choice = replace(choice, message=f"{choice.message}; {auto_p.message}" if auto_p else choice.message)
        return cfg, choice
    choice = auto_settings(engine, cfg, category, cfg.n_max if isinstance(cfg.n_max, int) else 0)
    if choice.budget is None:
        return cfg, choice
    return replace(cfg, n_max=choice.budget if budget else cfg.n_max,
                   p_min=(choice.p_min or None) if p_min else cfg.p_min), choice


def category_budgets(choice: AutoChoice | None) -> dict[str, int]:
    """The tuning's pick per category ({category: budget}, 0 = plain decoding won), for per-request budgets."""
    if choice is None or choice.record is None or choice.without_draft:  # no draft loaded: nothing to pick
        return {}
    return {c.category: c.candidate.budget if c.candidate else 0 for c in choice.record.choices}


def parse_auto(value: str | None, what: str, cast: type, *, adaptive: bool = False) -> tuple[object | None, bool]:
    """``--budget``/``--p-min`` text -> (value, auto): a number, 'auto', or nothing; with ``adaptive``,
    'adaptive' comes back as the value ADAPTIVE."""
    if value is None:
        return None, False
    if value.strip().lower() == "auto":
        return None, True
    if adaptive and value.strip().lower() == ADAPTIVE:
        return ADAPTIVE, False
    try:
        return cast(value), False
    except ValueError:
        choices = "a number, 'auto' or 'adaptive'" if adaptive else "a number or 'auto'"
        raise UsageError(f"{what} must be {choices} (got {value!r})") from None


APPLY_MARK = "# dspark tune --apply"


def apply_to_models(name: str, choice: tune.Choice, key_id: str, path: Path | None = None) -> Path:
    """Write the choice as the user's models.toml override of pair ``name`` (a table of only budget/p_min,
    which the registry lays over the packaged pair). A block this function wrote before is replaced; a
    table the user wrote is left alone (one-line error: edit it by hand). Written atomically."""
    if choice.candidate is None:
        raise UsageError(f"plain decoding beat every budget for {name}: nothing to apply (run with --no-draft)")
    path = path or config.user_models_path()
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    headers = (f'[pairs."{name}"]', f"[pairs.{name}]", f"[pairs.'{name}']")
    lines = text.splitlines()
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(APPLY_MARK) and i + 1 < len(lines) and lines[i + 1].strip() in headers:
            i += 2  # our earlier block: drop it up to the next table or mark
            while i < len(lines) and not lines[i].startswith("[") and not lines[i].startswith(APPLY_MARK):
                i += 1
            continue
        if line.strip() in headers or line.strip().startswith(tuple(h[:-1] + "." for h in headers)):
            raise UsageError(f"{path} already defines pair {name}: set budget = {choice.candidate.budget} there "
                             "by hand (dspark only replaces blocks it wrote)")
        kept.append(line)
        i += 1
    while kept and not kept[-1].strip():
        kept.pop()
    c = choice.candidate
    block = [f"{APPLY_MARK} (tuning {key_id}, category {choice.category}): this machine, engine and flags",
             f'[pairs."{name}"]', f"budget = {c.budget}"]
    if c.p_min:
        block.append(f"p_min = {c.p_min:g}")
    body = "\n".join([*kept, "", *block] if kept else block) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".models.", suffix=".toml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, path)
    return path
