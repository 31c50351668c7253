"""Provenance of bench records: sha256 cached by path + mtime + size, GPU names, the collected block."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from datetime import datetime

from dsparkcli import __version__
from dsparkcli.bench import provenance


def test_file_facts_hash_and_cache(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x" * 1000)
    cache = tmp_path / "hashes.json"
    facts = provenance.file_facts(f, cache_path=cache)
    assert facts.sha256 == hashlib.sha256(b"x" * 1000).hexdigest() and facts.size == 1000
    entry = json.loads(cache.read_text())[str(f.resolve())]
    assert entry == {"mtime_ns": f.stat().st_mtime_ns, "size": 1000, "sha256": facts.sha256}

    # a cache hit is served without reading the file: plant a marker digest and get it back
    entry["sha256"] = "0" * 64
    cache.write_text(json.dumps({str(f.resolve()): entry}))
    assert provenance.file_facts(f, cache_path=cache).sha256 == "0" * 64

    # same size, new mtime: the cache entry is stale and the file is hashed again
    f.write_bytes(b"y" * 1000)
    os.utime(f, ns=(entry["mtime_ns"] + 10**9, entry["mtime_ns"] + 10**9))
    assert provenance.file_facts(f, cache_path=cache).sha256 == hashlib.sha256(b"y" * 1000).hexdigest()


def test_damaged_cache_is_rebuilt(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    cache = tmp_path / "hashes.json"
    cache.write_text("{not json")
    assert provenance.file_facts(f, cache_path=cache).sha256 == hashlib.sha256(b"abc").hexdigest()
    assert str(f.resolve()) in json.loads(cache.read_text())


def test_default_cache_lives_in_the_dspark_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    provenance.file_facts(f)
    assert provenance.hash_cache_path() == tmp_path / "c" / "hashes.json"
    assert str(f.resolve()) in json.loads(provenance.hash_cache_path().read_text())


def _fake_smi(folder, body: str) -> None:
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def test_gpu_names_from_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance.gpu_names() == []  # no nvidia-smi: a CPU run
    _fake_smi(tmp_path, 'echo "NVIDIA H200"\necho "NVIDIA H200"\n')
    assert provenance.gpu_names() == ["NVIDIA H200", "NVIDIA H200"]
    _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert provenance.gpu_names() == []


def test_collect_block(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    _fake_smi(tmp_path, 'echo "NVIDIA H200"\n')
    t = tmp_path / "t.gguf"
    t.write_bytes(b"target")
    block = provenance.collect(
        engine, {"target": t, "mmproj": None}, argv=["dspark", "bench", "--budget", "5"], reps=3, extra={"run_id": "r"}
    )
    assert block["dspark_version"] == __version__
    build = provenance.build_record(engine)
    assert block["engine"] == {
        "server": str(engine.server),
        "version": engine.version,
        # the binary's commit, else the build record's (b11549's sdist tree has no git: its release)
        "commit": engine.commit or str(build.get("commit", "")),
        "backend": engine.backend,
        "build": build,
    }
    assert block["gpu"] == "NVIDIA H200"
    assert block["argv"] == ["dspark", "bench", "--budget", "5"] and block["reps"] == 3 and block["run_id"] == "r"
    assert block["files"] == {
        "target": {"path": str(t.resolve()), "size": 6, "sha256": hashlib.sha256(b"target").hexdigest()}
    }
    assert datetime.fromisoformat(block["timestamp"]).tzinfo is not None


def test_commit_falls_back_to_the_build_record(tmp_path):
    """A build from a source tarball: --version has no commit, engine.json names the source."""
    from dsparkcli.llama.engine import Engine

    bin_dir = tmp_path / "engine" / "srcf0a45bab-cuda-sm90" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    record = {"commit": "srcf0a45bab", "backend": "cuda", "cuda_arch": "90", "built_at": "2026-11-30T16:13:25Z"}
    (bin_dir.parent.parent / "engine.json").write_text(json.dumps(record))
    eng = Engine(
        server=bin_dir / "llama-server", bin_dir=bin_dir, source="cache", version="", commit="", backend="cuda"
    )
    block = provenance.collect(eng, {}, argv=[], reps=1)
    assert block["engine"]["commit"] == "srcf0a45bab" and block["engine"]["build"] == record
    assert provenance.build_record(Engine(server=tmp_path / "x", bin_dir=tmp_path, source="path")) is None
