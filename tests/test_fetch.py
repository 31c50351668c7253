"""Fetch + verify with the REAL huggingface_hub client against FakeHub (tests/support/hubserver.py).

In-process tests drive ``dsparkcli.hub.fetch`` (which reads HF_* variables at call time); CLI tests run
``dspark`` in a subprocess with the environment set, because huggingface_hub reads some variables
at import time.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download, try_to_load_from_cache

from dsparkcli.errors import DsparkError, HubError, UsageError, VerificationError
from dsparkcli.hub import fetch as core
from dsparkcli.hub.model_file import ModelFile
from dsparkcli.hub.registry import ModelPair, load_registry
from dsparkcli.units import format_size
from support.cli import interrupt_when, run_cli
from support.hubserver import FakeHub, git_blob_sha1

TOKEN = "hf_secretTOKENvalue1234567890"  # must never show up in any output

REGISTRY = """
[pairs.tiny]
default_draft = "q8"
[pairs.tiny.target]
repo = "o/t"
filename = "t.gguf"
[pairs.tiny.mmproj]
repo = "o/t"
filename = "mmproj-t.gguf"
[pairs.tiny.drafts.q8]
repo = "o/d"
glob = "*Q8_0*.gguf"
[pairs.tiny.drafts.q6]
repo = "o/d"
glob = "*Q6_K*.gguf"
"""


BIG = """
[pairs.big]
[pairs.big.target]
repo = "o/big"
filename = "big.gguf"
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def hub():
    with FakeHub() as fake:
        yield fake


@pytest.fixture
def files(hub):
    """Content of the 'tiny' pair's repos (and decoys the globs must not pick)."""
    rng = random.Random(7)
    content = {
        ("o/t", "t.gguf"): rng.randbytes(300_000),
        ("o/t", "mmproj-t.gguf"): rng.randbytes(20_000),
        ("o/d", "gguf/dspark-d-Q8_0.gguf"): rng.randbytes(120_000),
        ("o/d", "dspark-d-Q6_K.gguf"): rng.randbytes(90_000),
        ("o/d", "dspark-d-BF16.gguf"): rng.randbytes(10_000),
    }
    for (repo, path), data in content.items():
        hub.add_file(repo, path, data)
    hub.add_file("o/d", "README.md", b"# draft\n", lfs=False)
    return content


@pytest.fixture
def env(tmp_path, monkeypatch, hub, user_models):
    """An isolated HF cache, dspark config (with the test registry) and cache, pointed at FakeHub."""
    cfg = user_models(REGISTRY)
    values = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_ENDPOINT": hub.endpoint,
        "DSPARK_CONFIG_DIR": str(cfg),
        "DSPARK_CACHE_DIR": str(tmp_path / "dspark-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    return values


def tiny() -> ModelPair:
    return load_registry().get("tiny")


def cache_root(env) -> Path:
    return Path(env["HF_HOME"]) / "hub"


def gets(hub: FakeHub, since: int, suffix: str) -> list:
    return [r for r in hub.requests[since:] if r.method == "GET" and r.path.endswith(suffix)]


# -- happy path, layout, globs ----------------------------------------------------------------------


def test_fetch_downloads_verifies_and_lays_out_a_real_hf_cache(hub, files, env):
    fetched = core.fetch(tiny())
    assert [(f.role, f.filename, f.action) for f in fetched] == [
        ("target", "t.gguf", "downloaded"),
        ("mmproj", "mmproj-t.gguf", "downloaded"),
        ("draft", "gguf/dspark-d-Q8_0.gguf", "downloaded"),  # the glob picked Q8_0, not Q6_K or BF16
    ]
    for f in fetched:
        data = files[(f.repo, f.filename)]
        assert f.path.read_bytes() == data
        assert f.sha256 == sha256(data) and f.sha256_source == "hub" and f.size == len(data)
        assert f.bytes_downloaded == len(data)
        assert f.bytes_hashed_from_disk == 0  # hashed from the stream: no second pass over the file
        # huggingface_hub's own cache lookup finds the file: a genuine cache entry, blob named by sha256.
        assert try_to_load_from_cache(f.repo, f.filename, cache_dir=cache_root(env)) == str(f.path)
        assert f.path.is_symlink() and f.path.resolve().name == f.sha256
        assert f.path.resolve().parent.name == "blobs"
    assert hub.bytes_served == 300_000 + 20_000 + 120_000
    assert (cache_root(env) / "models--o--d" / "refs" / "main").read_text() == hub.commit("o/d")

    # hf_hub_download sees the cached file: it asks for metadata only, no bytes.
    served = hub.bytes_served
    path = hf_hub_download("o/t", "t.gguf", endpoint=hub.endpoint, cache_dir=cache_root(env))
    assert path == str(fetched[0].path) and hub.bytes_served == served

    # Second run: everything present and verified before (marker), nothing downloaded or re-hashed.
    again = core.fetch(tiny())
    assert [f.action for f in again] == ["present"] * 3 and hub.bytes_served == served
    assert core.ensure_files(tiny()) == {f.role: f.path for f in fetched}


def test_other_draft_glob_and_local_dir(hub, files, env, tmp_path):
    out = tmp_path / "models"
    paths = core.ensure_files(tiny(), "q6", local_dir=out)
    assert paths == {"target": out / "t.gguf", "mmproj": out / "mmproj-t.gguf", "draft": out / "dspark-d-Q6_K.gguf"}
    assert paths["draft"].read_bytes() == files[("o/d", "dspark-d-Q6_K.gguf")]
    assert not paths["draft"].is_symlink()
    assert list((out / ".cache" / "dspark").iterdir()) == []  # no partial files left behind
    assert core.local_status(tiny(), "q6", local_dir=out) == paths
    assert core.local_status(tiny(), "q8", local_dir=out)["draft"] is None
    assert core.local_status(tiny()) == {"target": None, "mmproj": None, "draft": None}  # the HF cache is separate


def test_non_lfs_file_is_verified_by_its_git_blob_id(hub, env):
    text = b"tokenizer config, stored in git, not LFS\n" * 10
    hub.add_file("o/g", "small.gguf", text, lfs=False)
    pair = _single("o/g", "small.gguf")
    [target, draft] = core.fetch(pair)
    assert target.sha256 == "" and target.sha256_source == "" and target.path.read_bytes() == text
    assert target.path.resolve().name == git_blob_sha1(text)  # huggingface_hub names such blobs by git oid
    hub.corrupt("o/g", "small.gguf")
    with pytest.raises(VerificationError, match="git blob id"):
        core.fetch(pair, local_dir=env["HF_HOME"] + "-dir")


def _single(repo: str, filename: str, **pins) -> ModelPair:
    f = ModelFile(role="target", key="target", repo=repo, filename=filename, **pins)
    return ModelPair(
        name="single",
        target=f,
        mmproj=None,
        drafts={"d": ModelFile(**{**f.__dict__, "role": "draft", "key": "d"})},
        default_draft="d",
    )


@pytest.mark.parametrize(
    ("glob", "message"),
    [
        ("*Q4_K_M*.gguf", "no file in o/d@main matches '*Q4_K_M*.gguf'; set an exact filename"),
        (
            "*.gguf",
            "'*.gguf' matches 3 files in o/d@main (dspark-d-BF16.gguf, dspark-d-Q6_K.gguf, gguf/dspark-d-Q8_0.gguf)",
        ),
    ],
)
def test_glob_must_match_exactly_one_file(hub, files, env, glob, message):
    pair = tiny()
    pair.drafts["q8"] = ModelFile(role="draft", key="q8", repo="o/d", glob=glob)
    with pytest.raises(HubError) as e:
        core.fetch(pair)
    assert message in str(e.value) and hub.bytes_served == 0


# -- interruptions ----------------------------------------------------------------------------------


def test_100_interrupted_downloads_resume_to_the_right_bytes(hub, env, tmp_path, monkeypatch):
    """Half the runs lose the connection at a random byte (resumed in the same run), half are Ctrl-C'd
    at a random point and resumed by the next run. Every one ends with the right sha256, resumes with
    a Range request from exactly the bytes kept, and never leaves a file at the final path early."""
    rng = random.Random(2024)
    data = rng.randbytes(256 * 1024)
    expected = hub.add_file("o/big", "big.gguf", data)
    pair = _single("o/big", "big.gguf")
    for i in range(100):
        home = tmp_path / f"hf{i}"
        monkeypatch.setenv("HF_HOME", str(home))
        offset = rng.randrange(1, len(data) - 1)
        first_request, served_before = len(hub.requests), hub.bytes_served
        if i % 2 == 0:
            hub.cut_next("o/big", "big.gguf", offset)  # the server sends bytes [0, offset] then hangs up
            paths = core.ensure_files(pair)
            ranges = [r.range for r in gets(hub, first_request, "big.gguf")]
            assert ranges == [None, f"bytes={offset + 1}-"], i
            assert hub.bytes_served - served_before == len(data), i  # not one byte sent twice
        else:

            def ctrl_c(event, offset=offset):
                if event.kind == "advance" and event.done >= offset:
                    raise KeyboardInterrupt

            with pytest.raises(KeyboardInterrupt):
                core.ensure_files(pair, on_progress=ctrl_c)
            assert core.local_status(pair) == {"target": None, "draft": None}, i  # nothing at the final path
            [partial] = list(home.rglob("*.incomplete"))
            kept = partial.stat().st_size
            assert offset <= kept <= len(data) and partial.read_bytes() == data[:kept], i
            resumed_at = len(hub.requests)
            [fetched, _] = core.fetch(pair)
            assert fetched.action == "resumed" and fetched.bytes_hashed_from_disk == kept, i
            ranges = [r.range for r in gets(hub, resumed_at, "big.gguf")]
            assert ranges == ([f"bytes={kept}-"] if kept < len(data) else []), i
            paths = {"target": fetched.path}
        assert sha256(paths["target"].read_bytes()) == expected, i
        assert list(home.rglob("*.incomplete")) == [], i


def test_ctrl_c_in_fetch_says_what_is_kept_and_the_next_run_resumes_it(hub, env, user_models):
    """issue 40: the line after Ctrl-C says what a second run resumes, sizes included (here: hub bytes)."""
    data = random.Random(40).randbytes(2 * 1024 * 1024)
    hub.add_file("o/big", "big.gguf", data)
    hub.throttle_bytes_per_s = 256 * 1024  # 256 KB a second: the first chunk lands, the rest takes 7 s
    env = {**env, "DSPARK_CONFIG_DIR": str(user_models(REGISTRY + BIG))}
    blobs = cache_root(env) / "models--o--big" / "blobs"

    def some_bytes_here() -> bool:
        return any(p.stat().st_size for p in blobs.glob("*.incomplete")) if blobs.is_dir() else False

    rc, _, stderr, _ = interrupt_when(["fetch", "big"], some_bytes_here, env=env)
    [partial] = blobs.glob("*.incomplete")
    kept = partial.stat().st_size
    assert rc == 130 and 0 < kept < len(data), stderr
    assert stderr.splitlines()[-1] == (
        f"dspark: error: interrupted: the partial download is kept (big.gguf: {format_size(kept)} of 2.1 MB); "
        "run the same command to resume"
    )
    hub.throttle_bytes_per_s = None
    again = run_cli("fetch", "big", "--json", env=env)
    assert again.returncode == 0, again.stderr
    [f] = json.loads(again.stdout)["files"]
    assert (
        f["action"] == "resumed" and f["bytes_hashed_from_disk"] == kept and f["bytes_downloaded"] == len(data) - kept
    )


# -- verification failures --------------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [False, True])
def test_wrong_bytes_are_rejected_and_never_reach_the_final_path(hub, files, env, pinned):
    good = files[("o/t", "t.gguf")]
    bad_sha = sha256(bytes(b ^ 0x5A for b in good))  # what FakeHub.corrupt serves
    pair = _single("o/t", "t.gguf", **({"sha256": sha256(good), "size": len(good)} if pinned else {}))
    hub.corrupt("o/t", "t.gguf")
    with pytest.raises(VerificationError) as e:
        core.fetch(pair)
    message = str(e.value)
    assert "\n" not in message
    assert f"t.gguf from o/t@{hub.commit('o/t')[:12]}: sha256 {bad_sha}, expected {sha256(good)}" in message
    assert ("(registry)" if pinned else "(hub)") in message and "run `dspark fetch single` again" in message
    assert try_to_load_from_cache("o/t", "t.gguf", cache_dir=cache_root(env)) is None
    assert core.local_status(pair)["target"] is None
    leftovers = [p.name for p in cache_root(env).rglob("*") if p.is_file()]
    assert leftovers == [] or all(name == "main" for name in leftovers)  # at most a ref, no blob/partial
    hub.corrupt("o/t", "t.gguf", on=False)
    assert core.ensure_files(pair)["target"].read_bytes() == good


def test_pins_that_disagree_with_the_hub_fail_before_downloading(hub, files, env):
    good = files[("o/t", "t.gguf")]
    with pytest.raises(VerificationError, match=f"registry pins sha256 {'0' * 64} but the hub reports {sha256(good)}"):
        core.fetch(_single("o/t", "t.gguf", sha256="0" * 64))
    with pytest.raises(VerificationError, match=f"registry pins 12 bytes but the hub has {len(good)}"):
        core.fetch(_single("o/t", "t.gguf", size=12))
    assert hub.bytes_served == 0


def test_a_present_file_that_rotted_is_caught_removed_and_fetched_again(hub, files, env):
    [target, *_] = core.fetch(tiny())
    blob = target.path.resolve()
    blob.write_bytes(b"\0" * blob.stat().st_size)  # same size, different bytes (and a new mtime)
    with pytest.raises(
        VerificationError,
        match=rf"{target.path} is corrupt: sha256 {sha256(bytes(300_000))}, expected {target.sha256}",
    ):
        core.fetch(tiny())
    assert not blob.exists() and core.local_status(tiny())["target"] is None
    assert core.fetch(tiny())[0].action == "downloaded"


# -- hub errors -------------------------------------------------------------------------------------


def test_gated_repo_says_hf_token_and_accepts_the_right_one(hub, files, env, monkeypatch):
    hub.gate("o/t", allowed_tokens=(TOKEN,))
    with pytest.raises(HubError) as e:
        core.fetch(tiny())
    assert str(e.value) == (
        f"o/t is gated (401: no token was sent): accept its licence at {hub.endpoint}/o/t "
        "and set HF_TOKEN to a token of that account"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError, match=r"o/t is gated \(403: the token has no access\)"):
        core.fetch(tiny())
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    first = len(hub.requests)
    assert core.ensure_files(tiny())["target"].read_bytes() == files[("o/t", "t.gguf")]
    assert all(r.authorized for r in hub.requests[first:])


def test_not_found_errors(hub, files, env):
    with pytest.raises(
        HubError, match=rf"^repository o/missing not found on {hub.endpoint} \(404\); if it is private, set HF_TOKEN$"
    ):
        core.fetch(_single("o/missing", "x.gguf"))
    with pytest.raises(HubError, match=r"^nope.gguf not found in o/t@main \(404\)"):
        core.fetch(_single("o/t", "nope.gguf"))
    with pytest.raises(HubError, match=r"^revision 'v9' not found in o/t \(404\)$"):
        core.fetch(tiny(), revision="v9")
    with pytest.raises(UsageError, match="is a commit, but tiny spans 2 repos"):
        core.fetch(tiny(), revision="a" * 40)


def test_offline_uses_the_cache_and_names_the_command_when_it_is_empty(hub, files, env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as e:
        core.ensure_files(tiny())
    assert str(e.value) == (
        "offline (HF_HUB_OFFLINE) and the target t.gguf of tiny is not in the HF cache; "
        "run `dspark fetch tiny` with network access first"
    )
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = core.ensure_files(tiny())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = len(hub.requests)
    assert core.ensure_files(tiny()) == online and len(hub.requests) == first  # no network at all


def test_disk_full_is_refused_before_any_byte(hub, files, env):
    hub.advertise_size("o/t", "t.gguf", 10**15)
    with pytest.raises(
        HubError, match=r"^disk full: t.gguf needs 1000000.0 GB more but .* free; free space or pass --dir"
    ):
        core.fetch(tiny(), yes=True)
    assert hub.bytes_served == 0


def test_big_downloads_need_confirmation(hub, files, env):
    hub.advertise_size("o/t", "t.gguf", 3 * 10**9)
    with pytest.raises(UsageError, match=r"tiny needs 3.0 GB of downloads; pass --yes"):
        core.fetch(tiny())
    seen = []
    with pytest.raises(DsparkError, match="fetch of tiny cancelled; nothing was downloaded"):
        core.fetch(tiny(), confirm=lambda planned: seen.extend(p.size for p in planned) or False)
    assert seen == [3 * 10**9, 20_000, 120_000] and hub.bytes_served == 0


# -- CLI --------------------------------------------------------------------------------------------


def test_cli_fetch_json_and_models_present_missing(hub, files, env, tmp_path):
    listing = json.loads(run_cli("models", "--json", env=env).stdout)
    tiny_files = {f["key"] or f["role"]: f for f in next(p for p in listing["pairs"] if p["name"] == "tiny")["files"]}
    assert {k: f["present"] for k, f in tiny_files.items()} == {
        "target": False,
        "mmproj": False,
        "q8": False,
        "q6": False,
    }

    result = run_cli("fetch", "tiny", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(f["role"], f["filename"], f["action"]) for f in report["files"]] == [
        ("target", "t.gguf", "downloaded"), ("mmproj", "mmproj-t.gguf", "downloaded"),
        ("draft", "gguf/dspark-d-Q8_0.gguf", "downloaded"),
    ]  # fmt: skip
    assert report["files"][2]["sha256"] == sha256(files[("o/d", "gguf/dspark-d-Q8_0.gguf")])

    text = run_cli("models", env=env)
    lines = {
        line.split()[0] + (" " + line.split()[1] if line.split()[0] == "draft" else ""): line
        for line in text.stdout.splitlines()
        if line.startswith("  ")
    }
    assert "present" in lines["target"] and "present" in lines["draft q8"] and "missing" in lines["draft q6"]
    assert report["files"][2]["path"] in lines["draft q8"]
    (tmp_path / "elsewhere").mkdir()  # a folder with none of the files (a missing one is an error, issue 40)
    listing = json.loads(run_cli("models", "--json", "--dir", str(tmp_path / "elsewhere"), env=env).stdout)
    # nothing from the hub is cached yet; the draft that ships with dspark always is
    assert not any(f["present"] for p in listing["pairs"] for f in p["files"] if f["source"] != "package")
    assert all(f["present"] for p in listing["pairs"] for f in p["files"] if f["source"] == "package")


def test_cli_errors_are_one_line_without_traceback_or_token(hub, files, env):
    hub.gate("o/t")
    cases = [
        (["fetch", "tiny"], {"HF_TOKEN": TOKEN}, 5, "o/t is gated (403: the token has no access)"),
        (["fetch", "tiny"], {"HF_HUB_OFFLINE": "1"}, 5, "run `dspark fetch tiny` with network access first"),
        (["fetch", "tinny"], {}, 2, "unknown model 'tinny' in the registry; did you mean tiny?"),
        (["fetch", "tiny", "--draft", "q4"], {}, 2, "unknown draft 'q4' of tiny; did you mean q8, q6?"),
    ]
    for args, extra, code, expected in cases:
        result = run_cli(*args, env={**env, **extra})
        assert result.returncode == code, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("dspark: error: ") and expected in lines[-1], result.stderr
        assert "Traceback" not in result.stderr and TOKEN not in result.stderr + result.stdout


def test_cli_asks_before_big_downloads_and_never_blocks_without_a_tty(hub, files, env):
    hub.advertise_size("o/d", "gguf/dspark-d-Q8_0.gguf", 2 * 10**9)
    result = run_cli("fetch", "tiny", env=env, input="")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "dspark: error: tiny needs 2.0 GB of downloads and stdin is not a terminal; pass --yes"
    )
    assert "2.0 GB" in result.stderr and hub.bytes_served == 0  # sizes shown before asking


def test_help_has_examples():
    for command in ("fetch", "models"):
        result = run_cli(command, "--help")
        assert result.returncode == 0 and f"  Examples:\n    dspark {command}" in result.stdout


def test_unreachable_hub_falls_back_to_the_cache(hub, files, env, monkeypatch):
    online = core.ensure_files(tiny())
    with FakeHub() as gone:
        dead_endpoint = gone.endpoint  # a port that nobody listens on once this block ends
    monkeypatch.setenv("HF_ENDPOINT", dead_endpoint)
    assert core.ensure_files(tiny()) == online
    with pytest.raises(HubError) as e:
        core.ensure_files(tiny(), "q6")  # not cached: the error says why
    # and suggests no HF_HUB_OFFLINE=1, which cannot serve a file that is not here (issue 40)
    assert str(e.value) == (
        f"cannot reach {dead_endpoint} for o/d (ConnectError) and the draft *Q6_K*.gguf of tiny is not "
        "cached; check the network"
    )
