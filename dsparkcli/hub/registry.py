"""The model registry: models.toml -> frozen dataclasses.

The canonical file ships as package data (``dsparkcli/data/models.toml``; the repo root's
``models.toml`` is a symlink to it), so a source checkout and an installed wheel read the same
bytes. The user's file (``config.user_models_path()``) and any ``extra_paths`` are read after it,
same schema; a pair defined later replaces an earlier pair of the same name. A later table that holds
only ``budget`` and/or ``p_min`` (what ``dspark tune --apply`` writes) changes just those of an earlier pair.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib

from dsparkcli.config import user_models_path
from dsparkcli.errors import UsageError
from dsparkcli.hub.model_file import ModelFile, Validator, file_entry
from dsparkcli.llama.protocol import DEFAULT_BUDGET

ROLES = ("target", "mmproj", "draft")
_PAIR_KEYS = {
    "description",
    "budget",
    "p_min",
    "default_draft",
    "flags",
    "acceptance",
    "target",
    "mmproj",
    "drafts",
    "vllm",
    "classic_draft",
    "engine",
}
_OVERRIDE_KEYS = {"budget", "p_min"}  # a table of only these tunes an earlier file's pair
_VLLM_KEYS = {
    "target",
    "target_revision",
    "draft",
    "draft_revision",
    "num_speculative_tokens",
    "tensor_parallel_size",
    "max_model_len",
}


@dataclass(frozen=True)
class VllmRecipe:
    """The same pair for vLLM: hub ids of the safetensors target and DSpark draft, and the recipe's sizes."""

    target: str  # hub repo id, e.g. openbmb/MiniCPM-V-4.7-35B-A3B
    draft: str  # the DSpark safetensors checkpoint, e.g. openbmb/MiniCPM-V-4.7-35B-A3B-DSpark
    target_revision: str | None = None
    draft_revision: str | None = None
    num_speculative_tokens: int | None = None  # None: the pair's budget
    tensor_parallel_size: int = 1
    max_model_len: int | None = None


@dataclass(frozen=True)
class ModelPair:
    name: str
    target: ModelFile
    mmproj: ModelFile | None
    drafts: dict[str, ModelFile]  # the DSpark drafts; empty for a pair that has none (plain or classic only)
    default_draft: str  # "" when drafts is empty
    budget: int = DEFAULT_BUDGET
    p_min: float | None = None  # --spec-draft-p-min (None: llama.cpp's default)
    flags: tuple[str, ...] = ()
    acceptance: dict[str, float] = field(default_factory=dict)  # category -> upstream acceptance length
    description: str = ""
    source: Path | None = None  # the models.toml this pair came from
    vllm: VllmRecipe | None = None  # [pairs.<name>.vllm]: the pair as `dspark serve --engine vllm` serves it
    # the pair whose target is this target's classic draft model (llama.cpp's draft-simple: the same
    # tokenizer, no DSpark training); checked to name a pair when the registry is loaded
    classic_draft: str | None = None
    # [pairs.<name>.engine]: what llama.cpp the pair needs, and the one command that builds such an engine
    # (named by the refusal when the engine in use cannot load one of its files)
    engine_needs: str = ""
    engine_build: str = ""

    def draft(self, key: str | None = None) -> ModelFile:
        """The draft named ``key`` (the default draft when None); UsageError with close matches if unknown."""
        if not self.drafts:
            classic = f" (its classic draft model is the pair {self.classic_draft})" if self.classic_draft else ""
            raise UsageError(
                f"{self.name} has no DSpark draft{classic}; pass --no-draft for plain decoding, "
                "or a draft file with --draft"
            )
        key = key or self.default_draft
        if key not in self.drafts:
            raise UsageError(_unknown("draft", key, self.drafts, f"of {self.name}"))
        return self.drafts[key]

    def files(self, draft_key: str | None = None) -> dict[str, ModelFile]:
        """role -> file for one runnable combination (mmproj only if the pair has one; no draft for a pair
        without DSpark drafts, unless ``draft_key`` asks for one)."""
        chosen = {"target": self.target}
        if self.drafts or draft_key is not None:
            chosen["draft"] = self.draft(draft_key)
        if self.mmproj is not None:
            chosen["mmproj"] = self.mmproj
        return {role: chosen[role] for role in ROLES if role in chosen}


@dataclass(frozen=True)
class Registry:
    pairs: dict[str, ModelPair]
    default: str | None
    sources: tuple[Path, ...] = ()

    def get(self, name: str | None = None) -> ModelPair:
        """The pair called ``name`` (the default pair when None); UsageError with close matches if unknown."""
        if name is not None and not name.strip():  # `fetch ""` (an unset shell variable): not the default pair
            raise UsageError("empty model name: name a pair from `dspark models`, or none for the default")
        name = name or self.default
        if name is None:
            raise UsageError("no model named and the registry has no default; `dspark models` lists them")
        if name not in self.pairs:
            raise UsageError(_unknown("model", name, self.pairs, "in the registry"))
        return self.pairs[name]

    def smallest(self, but: str | None = None, *, off_hub: bool = False) -> tuple[ModelPair, int] | None:
        """The pair (other than ``but``) with the fewest bytes, among those whose every file's size is
        pinned, and its size: the one to suggest to someone who did not ask for a big download.
        ``off_hub``: only pairs none of whose files comes from the HF hub (PyPI, shipped with dspark), the
        one to suggest where the hub is out of reach."""
        sized = [
            (sum(f.size or 0 for f in p.files().values()), name)
            for name, p in self.pairs.items()
            if name != but
            and p.drafts
            and all(f.size for f in p.files().values())
            and not (off_hub and any(f.source == "hub" for f in p.files().values()))
        ]
        if not sized:
            return None
        size, name = min(sized)
        return self.pairs[name], size


def _unknown(what: str, name: str, known: dict, where: str) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    # Prefix matches ("minicpm" -> "minicpm-v-4.7") are what users type; difflib's ratio misses them.
    close += [k for k in known if k.startswith(name) and k not in close]
    hint = f"; did you mean {', '.join(close[:3])}?" if close else f"; known: {', '.join(sorted(known)) or 'none'}"
    tail = " (`dspark models` lists them)" if what == "model" else ""
    return f"unknown {what} '{name}' {where}{hint}{tail}"


def packaged_models_path() -> Path:
    """The models.toml shipped inside the package."""
    return Path(str(resources.files("dsparkcli") / "data" / "models.toml"))


def load_registry(extra_paths: tuple[Path | str, ...] | list[Path | str] = ()) -> Registry:
    """Packaged registry, then the user's models.toml if present, then ``extra_paths`` (later wins)."""
    paths = [packaged_models_path()]
    user = user_models_path()
    if user.is_file():
        paths.append(user)
    paths.extend(Path(p) for p in extra_paths)
    pairs: dict[str, ModelPair] = {}
    default: str | None = None
    for path in paths:
        file_default, file_pairs = parse_models_file(path, overrides=pairs)
        pairs.update(file_pairs)
        default = file_default or default
    if default is not None and default not in pairs:
        raise UsageError(f"models.toml: default = '{default}' names no pair ({', '.join(sorted(pairs)) or 'none'})")
    for name, pair in pairs.items():  # after every file: a pair may name one defined in a later file
        if pair.classic_draft is not None and (pair.classic_draft not in pairs or pair.classic_draft == name):
            raise UsageError(
                f"{pair.source}: pairs.{name}.classic_draft: '{pair.classic_draft}' names no other "
                f"pair ({', '.join(sorted(set(pairs) - {name})) or 'none'})"
            )
    return Registry(pairs=pairs, default=default, sources=tuple(paths))


def upstream_acceptance(pair: str = "minicpm-v-4.7") -> dict[str, float]:
    """The packaged registry's upstream acceptance length per category of ``pair``, shortest first (what the
    stand-in studies emulate; a user's models.toml does not change the reference)."""
    _, pairs = parse_models_file(packaged_models_path())
    return dict(sorted(pairs[pair].acceptance.items(), key=lambda kv: kv[1]))


def parse_models_file(
    path: Path, overrides: dict[str, ModelPair] | None = None
) -> tuple[str | None, dict[str, ModelPair]]:
    """Read and validate one models.toml; errors name the file and the key. A table with only
    budget/p_min changes the pair of that name in ``overrides`` (the pairs read so far)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise UsageError(f"{path}: models file not found") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from e
    v = Validator(path)
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        v.fail("default", "must be a string naming a pair")
    unknown = set(data) - {"default", "pairs"}
    if unknown:
        v.fail(sorted(unknown)[0], "unknown key (expected 'default' and [pairs.<name>])")
    raw_pairs = v.table(data.get("pairs", {}), "pairs")
    pairs = {}
    for name, raw in raw_pairs.items():
        table = v.table(raw, f"pairs.{name}")
        if table and set(table) <= _OVERRIDE_KEYS:
            if name not in (overrides or {}):
                v.fail(f"pairs.{name}", "sets only budget/p_min but no earlier models.toml defines this pair")
            pairs[name] = _tuned(v, (overrides or {})[name], name, table)
        else:
            pairs[name] = _pair(v, name, table)
    return default, pairs


def _p_min(v: Validator, table: dict, where: str) -> float | None:
    value = table.get("p_min")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        v.fail(f"{where}.p_min", "must be a number within [0, 1]")
    return float(value)


def _tuned(v: Validator, pair: ModelPair, name: str, table: dict) -> ModelPair:
    where = f"pairs.{name}"
    budget = v.integer(table, "budget", where, minimum=1)
    p_min = _p_min(v, table, where)
    return replace(
        pair,
        budget=budget if budget is not None else pair.budget,
        p_min=p_min if "p_min" in table else pair.p_min,
        source=v.path,
    )


def _pair(v: Validator, name: str, table: dict) -> ModelPair:
    where = f"pairs.{name}"
    extra = set(table) - _PAIR_KEYS
    if extra:
        v.fail(f"{where}.{sorted(extra)[0]}", f"unknown key (expected {', '.join(sorted(_PAIR_KEYS))})")
    if "target" not in table:
        v.fail(f"{where}.target", "missing (required)")
    target = file_entry(v, table["target"], f"{where}.target", "target", "target")
    mmproj = file_entry(v, table["mmproj"], f"{where}.mmproj", "mmproj", "mmproj") if "mmproj" in table else None
    # No [drafts] at all: a pair without a DSpark draft (plain decoding, or its classic_draft).
    raw_drafts = v.table(table.get("drafts", {}), f"{where}.drafts")
    if "drafts" in table and not raw_drafts:
        v.fail(
            f"{where}.drafts",
            "is empty: give [pairs.<name>.drafts.<key>] tables, or leave it out for a pair without a DSpark draft",
        )
    drafts = {key: file_entry(v, raw, f"{where}.drafts.{key}", "draft", key) for key, raw in raw_drafts.items()}
    default_draft = v.string(table, "default_draft", where) or next(iter(drafts), "")
    if default_draft and default_draft not in drafts:
        v.fail(f"{where}.default_draft", f"'{default_draft}' is not one of the drafts ({', '.join(drafts)})")
    flags = table.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        v.fail(f"{where}.flags", "must be a list of strings")
    acceptance: dict[str, float] = {}
    for category, value in v.table(table.get("acceptance", {}), f"{where}.acceptance").items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
            v.fail(f"{where}.acceptance.{category}", "must be a number >= 1 (tokens per verification step)")
        acceptance[str(category)] = float(value)
    vllm = _vllm(v, table["vllm"], f"{where}.vllm") if "vllm" in table else None
    return ModelPair(
        name=name,
        target=target,
        mmproj=mmproj,
        drafts=drafts,
        default_draft=default_draft,
        budget=v.integer(table, "budget", where, minimum=1) or DEFAULT_BUDGET,
        p_min=_p_min(v, table, where),
        flags=tuple(flags),
        acceptance=acceptance,
        description=v.string(table, "description", where) or "",
        source=v.path,
        vllm=vllm,
        classic_draft=v.string(table, "classic_draft", where),
        **_engine(v, table.get("engine", {}), f"{where}.engine"),
    )


def _engine(v: Validator, raw: object, where: str) -> dict[str, str]:
    table = v.table(raw, where)
    extra = set(table) - {"needs", "build"}
    if extra:
        v.fail(f"{where}.{sorted(extra)[0]}", "unknown key (expected build, needs)")
    build = v.string(table, "build", where) or ""
    if build and not build.startswith("dspark engine build"):
        v.fail(f"{where}.build", "must be a `dspark engine build ...` command")
    return {"engine_needs": v.string(table, "needs", where) or "", "engine_build": build}


def _vllm(v: Validator, raw: Any, where: str) -> VllmRecipe:
    table = v.table(raw, where)
    extra = set(table) - _VLLM_KEYS
    if extra:
        v.fail(f"{where}.{sorted(extra)[0]}", f"unknown key (expected {', '.join(sorted(_VLLM_KEYS))})")
    repos = {}
    for key in ("target", "draft"):
        repo = v.string(table, key, where, required=True)
        assert repo is not None
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            v.fail(f"{where}.{key}", f"'{repo}' is not a hub repo id (owner/name)")
        repos[key] = repo
    return VllmRecipe(
        target=repos["target"],
        draft=repos["draft"],
        target_revision=v.string(table, "target_revision", where),
        draft_revision=v.string(table, "draft_revision", where),
        num_speculative_tokens=v.integer(table, "num_speculative_tokens", where, minimum=1),
        tensor_parallel_size=v.integer(table, "tensor_parallel_size", where, minimum=1) or 1,
        max_model_len=v.integer(table, "max_model_len", where, minimum=1),
    )
