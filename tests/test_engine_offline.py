"""`dspark engine build --sdist-file PATH`: the offline build (an air-gapped GPU server, the lease's machine). A
pinned sdist already on disk is known by its sha256 alone, copied where the build looks, and nothing is
downloaded; any other file is refused in one line before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama import building, sources

# the default engine's sdist as `make engine` downloaded it (read before a test isolates the cache)
CACHED_SDIST = sources.config.engine_source_dir() / f"{sources.XLLAMACPP.top}.tar.gz"


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("DSPARK_LLAMA_BIN", raising=False)
    return tmp_path / "cache"


def test_a_file_that_is_no_pinned_sdist_is_one_line_and_writes_nothing(isolated, tmp_path, cli):
    bogus = tmp_path / f"{sources.XLLAMACPP.top}.tar.gz"  # the right name, the wrong bytes
    bogus.write_bytes(b"not the sdist")
    res = cli("engine", "build", "--sdist-file", str(bogus), env={"DSPARK_CACHE_DIR": str(isolated)})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "none of the pinned sdists" in res.stderr
    res = cli(
        "engine", "build", "--sdist-file", str(tmp_path / "nope.tar.gz"), env={"DSPARK_CACHE_DIR": str(isolated)}
    )
    assert res.returncode == 2 and "no such file" in res.stderr
    with pytest.raises(UsageError, match="each name a tree"):
        building.build_engine(sdist_file=bogus, source=tmp_path)
    assert not (isolated / "src").exists()


@pytest.mark.engine
def test_the_pinned_file_under_any_name_is_copied_where_the_build_looks_and_nothing_is_downloaded(
    isolated, tmp_path, monkeypatch
):
    offline = tmp_path / "from-a-usb-stick.tar.gz"
    shutil.copyfile(CACHED_SDIST, offline)
    assert sources.sdist_of_file(offline) == sources.XLLAMACPP
    with pytest.raises(UsageError, match="not --sdist llama-cpp-python"):
        building.build_engine(sdist_file=offline, sdist=sources.LLAMA_CPP_PYTHON)

    def no_pip(*args, **kwargs):
        raise AssertionError(f"the offline build ran {args[0][:4]}")

    monkeypatch.setattr(sources.subprocess, "run", no_pip)
    dest = sources.install_sdist_file(offline, sources.XLLAMACPP)
    assert dest == isolated / "src" / f"{sources.XLLAMACPP.top}.tar.gz"
    assert sources._sha256(dest) == sources.XLLAMACPP.sha256 and not list(dest.parent.glob("*.partial"))
    unpacked: list[Path] = []
    monkeypatch.setattr(sources, "_unpack", lambda archive, dest, want_top=None: unpacked.append(archive))
    with pytest.raises(Exception, match="has no llama.cpp tree"):  # the stub unpacked nothing: the archive was found
        sources.sdist_tree(sources.XLLAMACPP)
    assert unpacked == [dest]
