"""What users expect to find (issue 40): shell completion, `engine path --json`, and where doctor says the
server logs go and how many are kept."""

from __future__ import annotations

import json
from pathlib import Path

from dsparkcli.llama.server import KEEP_LOGS, LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth


def test_show_completion_prints_a_script_that_completes_commands_and_options(cli):
    """`--install-completion` was "No such option". The script --show-completion prints calls dspark back
    with _DSPARK_COMPLETE set; those calls complete a subcommand and a command's own option."""
    script = cli("--show-completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_DSPARK_COMPLETE=complete_bash" in script.stdout and "complete -o default -F" in script.stdout

    def complete(words: str) -> list[str]:
        proc = cli(
            env={"_DSPARK_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("dspark eng") == ["engine"]
    assert complete("dspark engine pa") == ["path"]
    assert complete("dspark run --no-dr") == ["--no-draft"]
    assert "--install-completion" in cli("--help").stdout


def test_engine_path_json_says_where_the_engine_was_found(cli, engine):
    plain = cli("engine", "path", "--llama-bin", str(engine.server))
    doc = json.loads(cli("engine", "path", "--llama-bin", str(engine.server), "--json").stdout)
    assert plain.stdout.strip() == doc["server"] == str(engine.server.resolve())
    assert doc["bin_dir"] == str(Path(doc["server"]).parent) and doc["source"] == "--llama-bin"
    assert set(doc) == {"server", "bin_dir", "source", "commit", "backend"}


def test_doctor_names_the_log_folder_that_servers_write_and_its_limit(cli, engine, tmp_path, monkeypatch):
    env = {"DSPARK_CACHE_DIR": str(tmp_path / "cache")}
    doc = json.loads(cli("doctor", "--llama-bin", str(engine.server), "--json", env=env).stdout)
    assert (doc["log_dir"], doc["logs_kept"]) == (str(tmp_path / "cache" / "logs"), KEEP_LOGS)
    table = cli("doctor", "--llama-bin", str(engine.server), env={**env, "COLUMNS": "300"}).stdout
    line = next(row for row in table.splitlines() if row.strip().startswith("server logs"))
    assert line.split() == [
        "server",
        "logs",
        str(tmp_path / "cache" / "logs"),
        *f"(one per launch, the newest {KEEP_LOGS} kept)".split(),
    ]
    # the folder is the one a server dspark starts writes its log into
    monkeypatch.setenv("DSPARK_CACHE_DIR", env["DSPARK_CACHE_DIR"])
    pair = synth.write_pair(tmp_path / "pair", vocab=64, seed=9)
    with LlamaServer(engine, ServerConfig(model=pair.target, ctx=256, threads=1)) as srv:
        assert srv.log_path is not None and srv.log_path.parent == Path(doc["log_dir"])
