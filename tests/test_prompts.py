"""The shipped prompt kit and the JSONL loader's validation."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from dsparkcli.bench import prompts
from dsparkcli.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


def test_kit_has_80_plus_prompts_in_the_seven_categories():
    kit = prompts.load_prompts("default")
    assert len(kit) >= 80
    counts = {c: sum(p.category == c for p in kit) for c in prompts.CATEGORIES}
    assert set(p.category for p in kit) == set(prompts.CATEGORIES)
    assert min(counts.values()) >= 10, counts
    for p in kit:
        assert p.has_images == (p.category in prompts.VISION_CATEGORIES), p.id
        assert len(p.text) >= 20
    assert len({p.text for p in kit}) == len(kit)  # no duplicated questions


def test_kit_images_are_small_pngs_that_exist():
    kit = prompts.load_prompts()
    used = {img for p in kit for img in p.images}
    folder = prompts.kit_dir() / "images"
    on_disk = set(folder.glob("*.png"))
    assert used == on_disk  # every image is used, none is missing
    assert sum(f.stat().st_size for f in on_disk) < 1.5 * 1024 * 1024
    for f in on_disk:
        with Image.open(f) as im:
            assert im.format == "PNG" and im.size == (400, 300)


def test_image_script_reproduces_the_committed_pngs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "study.make_prompt_images", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    committed = prompts.kit_dir() / "images"
    made = sorted(tmp_path.glob("*.png"))
    assert [f.name for f in made] == sorted(f.name for f in committed.glob("*.png"))
    for f in made:
        assert f.read_bytes() == (committed / f.name).read_bytes(), f.name


def test_messages_put_the_text_after_the_last_image():
    p = next(p for p in prompts.load_prompts() if p.category == "ocr")
    msgs = p.messages()
    assert [m["role"] for m in msgs] == ["user"]
    content = msgs[0]["content"]
    assert [c["type"] for c in content] == ["image_url"] * len(p.images) + ["text"]
    assert content[-1]["text"] == p.text
    url = content[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == p.images[0].read_bytes()
    text = prompts.Prompt("x", "general", "hi", system="be brief").messages()
    assert text == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_select_by_category_group_and_limit():
    kit = prompts.load_prompts()
    text = prompts.select(kit, ["text"])
    assert {p.category for p in text} == set(prompts.TEXT_CATEGORIES)
    assert all(not p.has_images for p in text)
    two = prompts.select(kit, ["ocr,math"], limit=2)
    assert [p.category for p in two] == ["ocr", "ocr", "math", "math"]
    with pytest.raises(UsageError, match="no prompts in category poetry"):
        prompts.select(kit, ["poetry"])


def _write(tmp_path: Path, *lines: str) -> Path:
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_user_file_with_relative_images(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (8, 8), "red").save(tmp_path / "img" / "a.png")
    Image.new("RGB", (8, 8), "blue").save(tmp_path / "img" / "b.jpg", format="JPEG")
    f = _write(
        tmp_path,
        json.dumps(
            {"id": "v1", "category": "Charxiv", "prompt": "Which is red?", "images": ["img/a.png", "img/b.jpg"]}
        ),
        "",
        json.dumps({"id": "t1", "category": "mine", "prompt": "Hello", "system": "terse"}),
    )
    got = prompts.load_prompts(str(f))
    assert [p.id for p in got] == ["v1", "t1"]
    assert got[0].category == "charxiv" and got[0].images == (tmp_path / "img" / "a.png", tmp_path / "img" / "b.jpg")
    assert got[0].messages()[0]["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert got[1].system == "terse"


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"id": "a", "category": "math"}', r"mine.jsonl:1: field 'prompt' must be a non-empty string"),
        (
            '{"id": "a", "category": "math", "prompt": "x", "image": "a.png"}',
            r"mine.jsonl:1: unknown field\(s\) image",
        ),
        (
            '{"id": "a", "category": "math", "prompt": "x", "images": "a.png"}',
            r"'images' must be a list of file paths",
        ),
        (
            '{"id": "a", "category": "math", "prompt": "x", "images": ["nope.png"]}',
            r"mine.jsonl:1: prompt 'a': image not found: .*nope.png",
        ),
        ('{"id": "a", "category": "", "prompt": "x"}', r"field 'category' must be a non-empty string"),
        ('{"id": "a", "category": "math", "prompt": "x", "system": 3}', r"field 'system' must be a string"),
        ('["a"]', r"mine.jsonl:1: expected a JSON object, got list"),
        ('{"id": "a", ', r"mine.jsonl:1: invalid JSON"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    f = _write(tmp_path, line)
    with pytest.raises(UsageError, match=message):
        prompts.load_prompts(str(f))


def test_duplicate_ids_empty_files_and_non_images(tmp_path):
    rec = json.dumps({"id": "a", "category": "math", "prompt": "x"})
    with pytest.raises(UsageError, match=r"mine.jsonl:3: duplicate id 'a' \(first on line 1\)"):
        prompts.load_prompts(str(_write(tmp_path, rec, "", rec)))
    with pytest.raises(UsageError, match="holds no prompts"):
        prompts.load_prompts(str(_write(tmp_path, "", "  ")))
    (tmp_path / "fake.png").write_text("not an image")
    bad = json.dumps({"id": "a", "category": "ocr", "prompt": "x", "images": ["fake.png"]})
    with pytest.raises(UsageError, match=r"mine.jsonl:1: prompt 'a': not a readable image: .*fake.png"):
        prompts.load_prompts(str(_write(tmp_path, bad)))
    with pytest.raises(UsageError, match=r"prompt file not found: nope.jsonl \(built-in kits: default\)"):
        prompts.load_prompts("nope.jsonl")


EVAL = Path(__file__).resolve().parent / "data" / "eval"  # lines of the public files (data/eval/README.md)


def test_public_question_files_read_as_they_are() -> None:
    """MT-bench and Spec-Bench: the first turn, the category as given, the question_id as the id; a
    ``reference`` (Spec-Bench line 21) is read past."""
    lines = [json.loads(line) for line in (EVAL / "spec_bench_question.jsonl").read_text().splitlines()]
    spec = prompts.load_prompts(EVAL / "spec_bench_question.jsonl")
    assert [p.category for p in spec] == [
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    ]
    assert any("reference" in q for q in lines)
    assert [(p.id, p.text) for p in spec] == [(str(q["question_id"]), q["turns"][0]) for q in lines]
    mt = prompts.load_prompts(EVAL / "mt_bench_question.jsonl")
    first = json.loads((EVAL / "mt_bench_question.jsonl").read_text().splitlines()[0])
    assert (mt[0].id, mt[0].category, mt[0].text) == ("81", "writing", first["turns"][0])
    assert len(mt) == 10 and not any(p.images for p in mt)
    assert [p.id for p in prompts.select(mt, ["coding"], limit=2)] == ["121", "122"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question_id": 1, "category": "qa", "turns": []}', "first turn is a non-empty string"),
        (
            '{"question_id": 1, "category": "qa", "turns": ["hi"], "answer": "x"}',
            "unknown field(s) answer in a question",
        ),
        ('{"question_id": true, "category": "qa", "turns": ["hi"]}', "'question_id' must be a number"),
        ('{"question_id": 1, "turns": ["hi"]}', "'category' must be a non-empty string"),
    ],
)
def test_a_bad_question_line_is_one_usage_error(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "q.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(UsageError) as e:
        prompts.load_prompts(f)
    assert message in e.value.message and e.value.message.startswith(f"{f}:1: ")
