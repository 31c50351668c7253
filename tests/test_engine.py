"""Engine resolution, capability probing and doctor, against the real llama.cpp build."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from dsparkcli.errors import EngineNotFoundError
from dsparkcli.llama import building, patches, sources
from dsparkcli.llama import engine as engine_mod

HELP_WITHOUT_DSPARK = """----- common params -----
-h,    --help, --usage                  print usage and exit
--spec-type none,draft-simple,draft-eagle3,ngram-simple
                                        comma-separated list of types of speculative decoding to use
-mm,   --mmproj FILE                    path to a multimodal projector file
"""


def test_capabilities_of_the_real_binary(engine):
    caps = engine_mod.capabilities(engine)
    assert caps.draft_dspark
    assert "draft-dflash" in caps.spec_types and "none" in caps.spec_types
    assert caps.mmproj and caps.spec_synth_len and caps.spec_draft_p_min
    assert caps.request_draft_params and caps.adaptive_budget  # `make engine` builds dspark's patch series


def test_version_and_commit_read_from_the_binary(engine):
    assert engine.commit == sources.DEFAULT_SDIST.commit
    assert engine.version.startswith("0.6.0")  # b11549's llama.cpp version (b11312 said 0.5.0)
    assert engine.backend == "cpu"


def test_parse_capabilities_without_dspark():
    caps = engine_mod.parse_capabilities(HELP_WITHOUT_DSPARK)
    assert caps.spec_types == ("none", "draft-simple", "draft-eagle3", "ngram-simple")
    assert not caps.draft_dspark
    assert caps.mmproj
    assert not caps.spec_synth_len
    assert not caps.request_draft_params and not caps.adaptive_budget  # a stock llama.cpp


def test_parse_version_line():
    assert engine_mod.parse_version("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU") == (
        "0.5.0-dev",
        "0c1e570",
    )
    assert engine_mod.parse_version("garbage") == ("", "")
    # the b11549 sdist's tree has no git metadata
    assert engine_mod.parse_version("version: 0.6.0-dev (build 0, commit unknown)") == ("0.6.0-dev", "")


def test_resolution_order_flag_beats_env(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_LLAMA_BIN", str(tmp_path / "nowhere"))
    found = engine_mod.resolve_engine(str(engine.bin_dir))
    assert found.server == engine.server and found.source == "--llama-bin"
    with pytest.raises(EngineNotFoundError, match="nowhere"):
        engine_mod.resolve_engine()


def test_resolution_from_config_file(engine, tmp_path, monkeypatch):
    monkeypatch.delenv("DSPARK_LLAMA_BIN", raising=False)
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path))
    (tmp_path / "config.toml").write_text(f'[engine]\nllama_bin = "{engine.server}"\n')
    found = engine_mod.resolve_engine()
    assert found.server == engine.server and found.source.startswith("config")


def test_resolution_falls_back_to_path(engine, tmp_path, monkeypatch):
    monkeypatch.delenv("DSPARK_LLAMA_BIN", raising=False)
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", f"{engine.bin_dir}{os.pathsep}/usr/bin")
    assert engine_mod.resolve_engine().source == "PATH"
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EngineNotFoundError, match="dspark engine build"):
        engine_mod.resolve_engine()


def test_second_build_call_reuses_the_cache(engine):
    # make test already built it: a second call must not compile (it returns within seconds)
    eng, record, reused = building.build_engine(backend="cpu")
    assert reused
    assert eng.server == engine.server
    # b11549's sdist has no commit: the record (and the key) name its release
    assert record.commit == sources.DEFAULT_SDIST.label == "b11549" and record.backend == "cpu"
    assert set(record.targets) >= {"llama-server", "llama-cli", "llama-quantize", "llama-gguf-split"}
    for name in record.targets:
        assert (eng.bin_dir / name).is_file()


def test_doctor_json_reports_dspark(cli, engine):
    proc = cli("doctor", "--json", "--llama-bin", str(engine.server))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["capabilities"]["draft_dspark"] is True
    assert report["commit"] == sources.DEFAULT_SDIST.commit == ""  # not known for b11549: the release says which
    assert report["backend"] == "cpu"
    assert report["devices"] == []
    shipped = patches.shipped()
    assert report["patches"] == [p.name for p in shipped] and report["patch_hash"] == patches.series_hash(shipped)
    assert report["capabilities"]["adaptive_budget"] is True
    assert report["release"] == sources.DEFAULT_SDIST.release
    proc = cli("doctor", "--llama-bin", str(engine.server))
    assert re.search(rf"dspark patches\s+{patches.series_hash(shipped)}: 0001-", proc.stdout), proc.stdout
    assert re.search(rf"upstream\s+{re.escape(sources.DEFAULT_SDIST.describe())} *\n", proc.stdout), proc.stdout


def test_doctor_names_the_upstream_release_from_the_record_or_the_commit():
    from dsparkcli.doctor import upstream_line

    def line(**fields) -> str:
        return upstream_line(type("R", (), {"commit": "", "release": "", **fields})())

    assert line(commit="0c1e570", release="b11312") == "llama.cpp b11312 (0c1e570)"
    assert line(release="b11312") == "llama.cpp b11312 (0c1e570)"  # a binary that does not say its commit
    assert line(release="b11549") == "llama.cpp b11549 (commit unknown)" == sources.XLLAMACPP.describe()
    assert line(commit="deadbee") == "llama.cpp deadbee (release unknown)"
    assert sources.release_of("0c1e570") == "b11312" and sources.release_of("b11600") == "b11600"


def test_doctor_missing_binary_is_one_line(cli, tmp_path):
    proc = cli("doctor", "--llama-bin", str(tmp_path / "llama-server"))
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: llama-server not found")
    assert "Traceback" not in proc.stderr


def test_doctor_refuses_a_binary_without_dspark(cli, engine, tmp_path):
    # a real llama.cpp binary that is not a DSpark-capable server: llama-quantize answers --help
    # with its own usage and no --spec-type at all
    fake_dir = tmp_path / "bin"
    fake_dir.mkdir()
    (fake_dir / "llama-server").symlink_to(engine.tool("llama-quantize"))
    proc = cli("doctor", "--llama-bin", str(fake_dir))
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "cannot run DSpark drafts" in lines[0] and "dspark engine build" in lines[0]


def test_non_executable_binary_is_refused(cli, tmp_path):
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    proc = cli("doctor", "--llama-bin", str(script))
    assert proc.returncode == 3 and "not executable" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_every_command_help_has_examples(cli):
    import typer.main

    from dsparkcli.cli.app import app

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, prefix + [name])
            else:
                yield prefix + [name]

    paths = list(walk(typer.main.get_command(app), []))
    assert len(paths) >= 12  # run, serve, bench, fetch, models, inspect, requant, synth(+predict), doctor, engine x2
    for path in paths:
        proc = cli(*path, "--help")
        assert proc.returncode == 0, (path, proc.stderr)
        assert "Examples:" in proc.stdout, path


def test_version_flag(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("dspark ")


def test_unknown_option_is_a_usage_error(cli):
    proc = cli("doctor", "--no-such-flag")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_source_commit_ignores_an_enclosing_repository(tmp_path):
    import subprocess

    repo = tmp_path / "home"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True
    )
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    nested = repo / "cache" / "llama.cpp"
    nested.mkdir(parents=True)
    assert sources.source_commit(repo) == head  # a checkout: its own commit
    assert sources.source_commit(nested) != head  # a tree inside someone else's checkout: not theirs
    assert sources.source_commit(nested).startswith("src")


def test_the_default_build_has_the_rpc_backend_in_its_cache_key(engine):
    """`make test` builds once, with GGML_RPC=ON: the same llama-server plus --rpc and the worker."""
    assert engine_mod.build_key("0c1e570", "cpu", rpc=True) == "0c1e570-cpu-x86-64-v3-rpc"
    assert engine_mod.build_key("0c1e570", "cuda", "90", rpc=True) == "0c1e570-cuda-x86-64-v3-sm90-rpc"
    assert engine_mod.build_key("0c1e570", "cpu") == "0c1e570-cpu-x86-64-v3"  # --no-rpc: the older entry
    args = building.cmake_configure_args(Path("/src"), Path("/b"), "cpu", "", rpc=True)
    assert "-DGGML_RPC=ON" in args
    assert "-DGGML_RPC=ON" not in building.cmake_configure_args(Path("/src"), Path("/b"), "cpu", "")
    assert building.build_targets(True)[-1] == engine_mod.RPC_SERVER
    eng, record, reused = building.build_engine(backend="cpu")
    assert reused and record.rpc and engine_mod.RPC_SERVER in record.targets
    assert (eng.bin_dir / engine_mod.RPC_SERVER).is_file() and engine_mod.supports_rpc(eng)


def test_slot_hazard_warns_only_where_it_was_measured(tmp_path: Path) -> None:
    from dsparkcli.llama.engine import Engine
    from dsparkcli.llama.hazards import slot_hazard

    cuda = Engine(tmp_path / "llama-server", tmp_path, "test", backend="cuda")
    cpu = Engine(tmp_path / "llama-server", tmp_path, "test", backend="cpu")
    msg = slot_hazard(cuda, drafting=True, parallel=16)
    assert msg is not None and msg.startswith("16 slots with a DSpark draft on CUDA") and "8 ran clean" in msg
    assert slot_hazard(cuda, drafting=True, parallel=8) is None  # measured clean
    assert slot_hazard(cuda, drafting=False, parallel=16) is None  # plain at 16 ran clean
    assert slot_hazard(cpu, drafting=True, parallel=16) is None  # 16 slots on the CPU engine ran clean
