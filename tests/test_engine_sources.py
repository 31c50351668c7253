"""`dspark engine build --ref`: upstream's source archive of a release, from a local HTTP server that serves a
real llama.cpp archive (the pinned tree, tarred as upstream names it: ``llama.cpp-b11312/``). The refusals
come before any download, a wrong sha256 keeps nothing, a verified archive is unpacked once and cached, and
the build key names the release and its series (a release without one builds stock, said in one line).
The compile itself is the default engine's (tests/test_engine.py): here a complete build at the key the
archive's build would use is reused, so what is checked is everything up to the compiler."""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dsparkcli.errors import EngineBuildError, UsageError
from dsparkcli.llama import building, patches, sources
from dsparkcli.llama.engine import BUILD_TARGETS, RPC_SERVER, build_key


@dataclass
class ArchiveServer:
    url: str
    root: Path
    sha256: str
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def archive_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveServer]:
    tree = sources.sdist_tree(sources.LLAMA_CPP_PYTHON)
    root = tmp_path_factory.mktemp("archives")
    tags = root / "refs" / "tags"
    tags.mkdir(parents=True)
    archive = tags / "b11312.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
        tf.add(tree, arcname="llama.cpp-b11312", filter=lambda ti: None if ti.name.endswith("/.git") else ti)
    (tags / "b11400.tar.gz").hardlink_to(archive)  # a release dspark has no series for
    data = archive.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    seen: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            if not self.path.startswith("/cut/"):
                return super().do_GET()
            # the connection drops after 1 MiB of a body announced whole
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: 1 << 20])
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args) -> None:  # quiet
            seen.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ArchiveServer(f"http://127.0.0.1:{server.server_address[1]}", root, sha, seen)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive_server: ArchiveServer) -> Path:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("DSPARK_LLAMA_BIN", raising=False)
    monkeypatch.setenv(sources.ARCHIVE_URL_ENV, archive_server.url)
    archive_server.requests.clear()
    return tmp_path / "cache"


def _complete_build(cache: Path, key: str, source: Path, **record) -> Path:
    """A finished build at ``key`` (its binaries stand-ins): build_engine reuses it instead of compiling."""
    bin_dir = cache / "engine" / key / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in (*BUILD_TARGETS, RPC_SERVER):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    fields = {"commit": key.split("-")[0], "backend": "cpu", "cuda_arch": "", "source_dir": str(source)}
    fields |= {"bin_dir": str(bin_dir), "cpu_arch": "x86-64-v3", "rpc": True, **record}
    (cache / "engine" / key / "engine.json").write_text(json.dumps(fields))
    return bin_dir


def test_refusals_are_one_line_and_come_before_any_download(isolated, archive_server):
    with pytest.raises(UsageError, match=r"^dspark does not know the sha256 of llama.cpp b11312's .*--sha256"):
        building.build_engine(ref="b11312")
    with pytest.raises(UsageError, match="neither a llama.cpp release"):
        building.build_engine(ref="v1.0", sha256=archive_server.sha256)
    with pytest.raises(UsageError, match="is not 64 hex digits"):
        building.build_engine(ref="b11312", sha256="abc")
    with pytest.raises(UsageError, match="pass --ref too"):
        building.build_engine(sha256=archive_server.sha256)
    with pytest.raises(UsageError, match="--source and --ref name two trees"):
        building.build_engine(ref="b11312", source=isolated)
    with pytest.raises(UsageError, match="not the sha256 dspark knows"):
        sources.archive_ref("b11312", "0" * 64, known={"b11312": "1" * 64})
    # a release dspark knows: no --sha256 needed; a commit is lower-cased and named by its first 12 digits
    known = sources.archive_ref("b11312", known={"b11312": archive_server.sha256})
    assert known.sha256 == archive_server.sha256 and known.url == f"{archive_server.url}/refs/tags/b11312.tar.gz"
    commit = sources.archive_ref("0C1E570ABCDEF0123", "1" * 64)
    assert (commit.label, commit.url) == ("0c1e570abcde", f"{archive_server.url}/0c1e570abcdef0123.tar.gz")
    assert sources.release_of(commit.ref) == "b11312" and sources.release_of("deadbee") == ""
    with pytest.raises(UsageError, match=r"patch series are for b11312, b11549 only: build b11400 without --patches"):
        building.build_engine(ref="b11400", sha256=archive_server.sha256, patches=True)
    assert archive_server.requests == [] and not (isolated / "src").exists()


def test_a_wrong_sha256_keeps_nothing_and_a_verified_archive_is_cached(isolated, archive_server):
    wrong = sources.archive_ref("b11312", "0" * 64)
    with pytest.raises(EngineBuildError, match=rf"has sha256 {archive_server.sha256}, expected 0{{64}}; nothing"):
        sources.archive_tree(wrong)
    archives = isolated / "src" / "archive"
    assert sorted(p.name for p in archives.iterdir()) == []  # no partial, no archive, no tree
    with pytest.raises(EngineBuildError, match=r"cannot download llama.cpp b99999: HTTP 404 from http://"):
        sources.archive_tree(sources.archive_ref("b99999", archive_server.sha256))
    assert sorted(p.name for p in archives.iterdir()) == []
    lines: list[tuple[float, str]] = []
    ref = sources.archive_ref("b11312", archive_server.sha256)
    tree = sources.archive_tree(ref, on_line=lambda pct, line: lines.append((pct, line)))
    assert tree == archives / "llama.cpp-b11312" and (tree / "CMakeLists.txt").is_file()
    assert (tree / sources.ARCHIVE_MARKER).read_text().strip() == archive_server.sha256
    pristine = sources.sdist_tree(sources.LLAMA_CPP_PYTHON)
    assert (tree / "common/speculative.cpp").read_bytes() == (pristine / "common/speculative.cpp").read_bytes()
    size = (archive_server.root / "refs/tags/b11312.tar.gz").stat().st_size
    assert lines[-2][1] == f"downloading llama.cpp b11312: {size / 1e6:.1f} of {size / 1e6:.1f} MB"
    assert lines[-2][0] == pytest.approx(100.0) and lines[-1][1] == "extracting llama.cpp-b11312.tar.gz"
    assert sorted(p.name for p in archives.iterdir()) == ["llama.cpp-b11312", "llama.cpp-b11312.tar.gz"]
    served = len(archive_server.requests)
    assert sources.archive_tree(ref) == tree and len(archive_server.requests) == served  # cached: no request


def test_a_cut_download_is_one_line_and_no_archive(isolated, archive_server, monkeypatch):
    monkeypatch.setenv(sources.ARCHIVE_URL_ENV, f"{archive_server.url}/cut")
    with pytest.raises(
        EngineBuildError,
        match=r"^the download of llama.cpp b11312 from http://.*/cut/refs/tags/b11312.tar.gz stopped at 1.0 of \d+.\d MB; nothing was kept",
    ):
        building.build_engine(ref="b11312", sha256=archive_server.sha256)
    assert archive_server.requests == ["/cut/refs/tags/b11312.tar.gz"]
    assert sorted(p.name for p in (isolated / "src" / "archive").iterdir()) == []


def test_the_build_key_names_the_release_and_takes_its_series(isolated, archive_server):
    tree = sources.archive_tree_dir(sources.archive_ref("b11312", archive_server.sha256))
    h = patches.series_hash(patches.series_for("b11312"))
    key = build_key("b11312", "cpu", rpc=True, patch_hash=h)
    assert key == f"b11312-cpu-x86-64-v3-rpc-p{h}"
    bin_dir = _complete_build(isolated, key, tree, patch_hash=h, source_sha256=archive_server.sha256)
    eng, rec, reused = building.build_engine(ref="b11312", sha256=archive_server.sha256)
    assert reused and eng.bin_dir == bin_dir and (tree / "CMakeLists.txt").is_file()
    # a release without a series: stock, its own key, and the CLI says so in one line
    stock_tree = sources.archive_tree_dir(sources.archive_ref("b11400", archive_server.sha256))
    stock_bin = _complete_build(
        isolated, "b11400-cpu-x86-64-v3-rpc", stock_tree, release="b11400", source_sha256=archive_server.sha256
    )
    eng, rec, reused = building.build_engine(ref="b11400", sha256=archive_server.sha256)
    assert reused and eng.bin_dir == stock_bin and rec.patches == [] and rec.release == "b11400"
    assert (
        building.series_note("b11400") == "stock llama.cpp b11400: dspark's patch series are for b11312, b11549 only"
    )


def test_cli_ref_build_says_stock_in_one_line(isolated, archive_server, cli):
    stock_tree = sources.archive_tree_dir(sources.archive_ref("b11400", archive_server.sha256))
    _complete_build(
        isolated, "b11400-cpu-x86-64-v3-rpc", stock_tree, release="b11400", source_sha256=archive_server.sha256
    )
    env = {"DSPARK_CACHE_DIR": str(isolated), sources.ARCHIVE_URL_ENV: archive_server.url}
    res = cli("engine", "build", "--ref", "b11400", "--sha256", archive_server.sha256, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1] == "commit b11400, backend cpu, rpc, stock"
    assert lines[-1] == "stock llama.cpp b11400: dspark's patch series are for b11312, b11549 only"
    res = cli("engine", "build", "--ref", "b11400", env=env)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "dspark does not know the sha256 of llama.cpp b11400's source archive: pass --sha256" in res.stderr
    res = cli("engine", "build", "--sdist", "nope", env=env)
    assert res.returncode != 0 and "--sdist 'nope' is not one dspark pins" in res.stderr
