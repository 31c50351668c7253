"""Training prompts for `dspark distill`: varied, seeded, and never the evaluation kit.

A quick probe showed that prompt diversity, not draft capacity, limits a small draft: 3 k templated
prompts were memorised and transferred poorly. So the corpus combines (a) many task templates x many
subjects x random numbers across the text categories, and (b) questions the target writes itself from
meta-prompts (see data.py), sampled at temperature. The 84-prompt bench kit is the held-out evaluation
set: any prompt that shares most of its word trigrams with a kit prompt is dropped (``held_out``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.distill.families import SPECIFIC
from dsparkcli.distill.templates import (
    CODE_EXTRA,
    CODE_FORMS,
    CODE_TASKS,
    CONCEPTS,
    GENERAL_FORMS,
    GENERAL_TOPICS,
    LANGS,
    MATH_FORMS,
    META_FORMS,
    SQL_TASKS,
)
from dsparkcli.errors import UsageError


@dataclass(frozen=True)
class TrainPrompt:
    category: str
    text: str
    # the template (or meta-prompt) it came from, and the subject it was filled with (group_name):
    # validation holds whole templates and subjects out, so early stopping measures transfer to
    # phrasings and tasks the draft never saw, as the kit's prompts are
    group: str = ""


# One-line templates draw a subject from a shared list (a code task, a concept, a general topic). A draft
# learns the answers to those subjects: the same templates scored 2.69 on training tasks and 2.22 on new
# ones (study/results/real3/transfer-code.json), so validation must hold subjects out too, not only templates.
# The material-carrying families (families.py) also draw general topics but name no subject (their
# material is random), so a held-out topic can still reach training through one of them.
SUBJECT_KEYS = ("task", "sql", "concept", "topic")
_SUBJECT_SEP = "|"


def group_name(template: str, subject: str = "") -> str:
    return f"{template}{_SUBJECT_SEP}{subject}" if subject else template


def split_group(group: str) -> tuple[str, str]:
    """(template, subject) of a group name; subject '' when the prompt had none (or an older dataset)."""
    template, _, subject = group.partition(_SUBJECT_SEP)
    return template, subject


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def held_out(prompts: Iterable[TrainPrompt], evaluation: Iterable[str], overlap: float = 0.5) -> list[TrainPrompt]:
    """Drop training prompts that share more than ``overlap`` of their word trigrams with an eval prompt."""
    evals = [g for g in (_trigrams(e) for e in evaluation) if g]
    kept = []
    for p in prompts:
        g = _trigrams(p.text)
        if g and any(len(g & e) / min(len(g), len(e)) > overlap for e in evals):
            continue
        kept.append(p)
    return kept


def templated(n: int, seed: int, specific: float = 0.5) -> list[TrainPrompt]:
    """``n`` distinct templated prompts, a third per text category, reproducible from ``seed``; a share
    ``specific`` of them from the material-carrying families (SPECIFIC), the rest one-line templates."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[TrainPrompt] = []
    forms = {"code": CODE_FORMS + CODE_EXTRA, "math": MATH_FORMS, "general": GENERAL_FORMS}
    fill = {
        "code": lambda: dict(
            lang=rng.choice(LANGS),
            task=rng.choice(CODE_TASKS),
            concept=rng.choice(CONCEPTS),
            concept2=rng.choice(CONCEPTS),
            sql=rng.choice(SQL_TASKS),
        ),
        "math": lambda: dict(
            a=rng.randint(2, 19),
            b=rng.randint(2, 29),
            c=rng.randint(2, 40),
            d=rng.randint(1, 30),
            e=rng.randint(2, 6),
            s=rng.randint(3, 15),
            p=rng.randint(2, 50),
            s2=rng.randint(2, 12),
            big=rng.randint(40, 960),
            big2=rng.randint(40, 960),
            num=rng.randint(2, 99),
            den=rng.randint(2, 99),
            h=rng.randint(6, 20),
            m=rng.randint(0, 5),
            per=2 * rng.randint(10, 40),
            area=rng.randint(20, 300),
            prime=rng.choice((3, 5, 7, 11, 13)),
        ),
        "general": lambda: dict(topic=rng.choice(GENERAL_TOPICS), topic2=rng.choice(GENERAL_TOPICS)),
    }
    cats = list(forms)
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        cat = cats[len(out) % len(cats)]
        if rng.random() < specific:
            text, group = SPECIFIC[cat](rng, GENERAL_TOPICS)
        else:
            k = rng.randrange(len(forms[cat]))
            form, values = forms[cat][k], fill[cat]()
            subject = next((values[key] for key in SUBJECT_KEYS if "{" + key + "}" in form), "")
            text, group = form.format(**values), group_name(f"{cat}:{k}", subject)
        if text not in seen:
            seen.add(text)
            out.append(TrainPrompt(cat, text, group))
    return out


def meta_prompts(n: int, seed: int) -> list[TrainPrompt]:
    rng = random.Random(seed + 1)
    out = []
    for i in range(n):
        cat = ("code", "math", "general")[i % 3]
        k = rng.randrange(len(META_FORMS[cat]))
        out.append(
            TrainPrompt(
                cat,
                META_FORMS[cat][k].format(
                    concept=rng.choice(CONCEPTS), lang=rng.choice(LANGS), topic=rng.choice(GENERAL_TOPICS)
                ),
                f"self-{cat}:{k}",
            )
        )
    return out


def load_user_prompts(path: Path) -> list[TrainPrompt]:
    """``--prompts FILE``: one prompt per line, or JSONL objects with ``prompt`` (and ``category``)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read prompts file {path}: {e.__class__.__name__}") from e
    out = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
                out.append(TrainPrompt(str(obj.get("category", "user")), str(obj["prompt"]), "user"))
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{path}:{n}: not a JSON object with a 'prompt' field") from e
        else:
            out.append(TrainPrompt("user", line, "user"))
    if not out:
        raise UsageError(f"prompts file {path} has no prompts")
    return out
