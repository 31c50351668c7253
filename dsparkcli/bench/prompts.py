"""Prompt kits for `dspark bench`: the shipped kit and users' own JSONL files, validated line by line.

One JSON object per line (schema in docs/PROMPTS.md)::

    {"id": "ocr-01", "category": "ocr", "prompt": "Transcribe ...", "images": ["images/receipt.png"]}

Image paths are relative to the JSONL file. Images are sent before the text of the same turn:
llama-server asserts when a prompt ends with an image.

The public question files of MT-bench and Spec-Bench (``{"question_id", "category", "turns": [...]}``,
optionally ``reference``) are read as they are: the first turn is the prompt, the category is kept as given,
the id is the ``question_id``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dsparkcli.errors import UsageError
from dsparkcli.images import load_image
from dsparkcli.llama import protocol

# The upstream card's categories: four vision, three text.
VISION_CATEGORIES = ("mmmu", "mathvista", "charxiv", "ocr")
TEXT_CATEGORIES = ("math", "code", "general")
CATEGORIES = VISION_CATEGORIES + TEXT_CATEGORIES
CATEGORY_GROUPS = {"vision": VISION_CATEGORIES, "text": TEXT_CATEGORIES}

KITS = {"default": "kit.jsonl"}  # kit name -> file under dsparkcli/data/prompts/
DEFAULT_KIT = "default"

_KEYS_REQUIRED = ("id", "category", "prompt")
_KEYS_OPTIONAL = ("images", "system")
_QUESTION_KEYS = ("question_id", "category", "turns")  # MT-bench / Spec-Bench question files
_QUESTION_OPTIONAL = ("reference",)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    images: tuple[Path, ...] = ()
    system: str | None = None

    @property
    def has_images(self) -> bool:
        return bool(self.images)

    def messages(self) -> list[dict[str, Any]]:
        """OpenAI-style chat messages; images first, the text after the last image."""
        return protocol.build_messages(self.text, [image_data_url(p) for p in self.images], self.system)


# The one prompt of step-cost and stand-in measurements (cost cells, tune studies, patch switches): with
# emulated acceptance the text matters only as a fixed length of prompt, the same in every run.
FIXED_SYNTHETIC = Prompt("fixed", "synthetic", "Write a detailed, step-by-step explanation of how a hash map works.")


def image_base64(path: Path) -> str:
    return protocol.image_base64(Path(path).read_bytes())


def image_data_url(path: Path) -> str:
    return load_image(path).data_url


def kit_dir() -> Path:
    return Path(str(resources.files("dsparkcli") / "data" / "prompts"))


def resolve_source(source: str | Path | None) -> Path:
    """A kit name (``default``) or a path to a JSONL file → the JSONL path."""
    if source is None:
        source = DEFAULT_KIT
    if isinstance(source, str) and source in KITS:
        return kit_dir() / KITS[source]
    path = Path(source).expanduser()
    if not path.is_file():
        kits = ", ".join(KITS)
        raise UsageError(f"prompt file not found: {source} (built-in kits: {kits})")
    return path


def parse_record(obj: Any, *, where: str, base_dir: Path) -> Prompt:
    """Validate one decoded JSONL line. ``where`` is ``file:line`` for error messages."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "turns" in obj or "question_id" in obj:
        return _question(obj, where=where)
    unknown = sorted(set(obj) - set(_KEYS_REQUIRED) - set(_KEYS_OPTIONAL))
    if unknown:
        raise UsageError(
            f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(_KEYS_REQUIRED + _KEYS_OPTIONAL)})"
        )
    for key in _KEYS_REQUIRED:
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{where}: field '{key}' must be a non-empty string")
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        raise UsageError(f"{where}: field 'system' must be a string")
    images_raw = obj.get("images", [])
    if not isinstance(images_raw, list) or not all(isinstance(i, str) and i for i in images_raw):
        raise UsageError(f"{where}: field 'images' must be a list of file paths")
    images: list[Path] = []
    for rel in images_raw:
        path = Path(rel).expanduser()
        path = path if path.is_absolute() else base_dir / path
        try:  # decoded now, as `dspark run` does: a corrupt image fails before any server starts
            load_image(path)
        except UsageError as e:
            raise UsageError(f"{where}: prompt '{obj['id']}': {e.message}") from e
        images.append(path)
    return Prompt(
        id=obj["id"], category=obj["category"].strip().lower(), text=obj["prompt"], images=tuple(images), system=system
    )


def _question(obj: dict[str, Any], *, where: str) -> Prompt:
    """An MT-bench / Spec-Bench question: its first turn (later turns answer the model's first reply, which
    a single-turn benchmark does not have)."""
    unknown = sorted(set(obj) - set(_QUESTION_KEYS) - set(_QUESTION_OPTIONAL))
    if unknown:
        raise UsageError(
            f"{where}: unknown field(s) {', '.join(unknown)} in a question (allowed: "
            f"{', '.join(_QUESTION_KEYS + _QUESTION_OPTIONAL)})"
        )
    qid, category, turns = obj.get("question_id"), obj.get("category"), obj.get("turns")
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or not str(qid).strip():
        raise UsageError(f"{where}: field 'question_id' must be a number or a non-empty string")
    if not isinstance(category, str) or not category.strip():
        raise UsageError(f"{where}: field 'category' must be a non-empty string")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise UsageError(f"{where}: field 'turns' must be a list whose first turn is a non-empty string")
    return Prompt(id=str(qid), category=category.strip().lower(), text=turns[0])


def load_prompts(source: str | Path | None = None) -> tuple[Prompt, ...]:
    """Every prompt of a kit or JSONL file, validated; ids must be unique."""
    path = resolve_source(source)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from e
        prompt = parse_record(obj, where=where, base_dir=path.parent)
        if prompt.id in seen:
            raise UsageError(f"{where}: duplicate id '{prompt.id}' (first on line {seen[prompt.id]})")
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{path} holds no prompts")
    return tuple(prompts)


def select(
    prompts: tuple[Prompt, ...], categories: list[str] | tuple[str, ...] | None = None, limit: int | None = None
) -> tuple[Prompt, ...]:
    """Prompts of the given categories (``vision``/``text`` name groups), at most ``limit`` per category."""
    chosen = prompts
    if categories:
        wanted: list[str] = []
        for c in categories:
            for part in str(c).split(","):
                part = part.strip().lower()
                if part:
                    wanted.extend(CATEGORY_GROUPS.get(part, (part,)))
        present = {p.category for p in prompts}
        missing = [c for c in wanted if c not in present]
        if missing:
            raise UsageError(
                f"no prompts in categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)} "
                f"(available: {', '.join(sorted(present))})"
            )
        chosen = tuple(p for p in prompts if p.category in wanted)
    if limit is not None:
        if limit < 1:
            raise UsageError("--limit must be at least 1")
        counts: dict[str, int] = {}
        kept: list[Prompt] = []
        for p in chosen:
            counts[p.category] = counts.get(p.category, 0) + 1
            if counts[p.category] <= limit:
                kept.append(p)
        chosen = tuple(kept)
    return chosen
