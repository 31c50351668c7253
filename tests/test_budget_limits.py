"""What a budget may be, one check for run, serve, bench and tune (issue 28 item 5), and a running server's own
budget (item 9), on the real engine with known-answer pairs.

* A budget the user gives above what the draft proposes per step is refused in one line by every command
  (bench ran `--budget 99` and labelled a row `@99`); a default the user never gave (the registry's or 5) is
  clamped to the draft and said so (a block-4 draft failed on the default 5).
* `run --server URL --budget K`: the server's budget is asked first (an empty request's generation_settings);
  K above it is refused before anything is sent (llama-server would cap it silently and echo K), and the
  statistics name the budget the request drafted with.
"""

from __future__ import annotations

import json

import pytest

from dsparkcli.llama import protocol
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.pairs import draft_limit
from dsparkcli.synth import known_answer as synth


@pytest.fixture(scope="module")
def block8(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("block8"), accept_rate=0.7, seed=11, block_size=8)


@pytest.fixture(scope="module")
def block4(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("block4"), accept_rate=0.7, seed=11, block_size=4)


def _env(engine, tmp_path) -> dict[str, str]:
    return {
        "DSPARK_LLAMA_BIN": str(engine.bin_dir),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "cfg"),
    }


def _one_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


def _prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a-0", "category": "alpha", "prompt": "question zero"}\n')
    return path


def test_a_given_budget_above_the_draft_is_refused_by_every_command(engine, block8, cli, tmp_path):
    limit = draft_limit(block8.draft)
    assert (limit.most, limit.block) == (8, 8)  # a bonus anchor: every position of the block is a draft
    env, files = _env(engine, tmp_path), ["--target", str(block8.target), "--draft", str(block8.draft)]
    said = f"--budget 99 is above what the draft proposes per step: at most 8 (block size 8, {block8.draft.name})"
    for cmd in (
        ("run", *files, "hi", "--budget", "99"),
        ("serve", *files, "--budget", "99", "--print"),
        ("bench", *files, "--prompts", str(_prompts(tmp_path)), "--budget", "3", "99", "-n", "4"),
    ):
        assert _one_error(cli(*cmd, env=env, timeout=120)) == f"dspark: error: {said}", cmd
    proc = cli("tune", *files, "--prompts", str(_prompts(tmp_path)), "--budgets", "2", "99", env=env, timeout=120)
    assert _one_error(proc) == f"dspark: error: {said.replace('--budget', '--budgets')}"
    assert not (tmp_path / "cache" / "logs").exists()  # refused before any server started
    assert (
        _one_error(cli("bench", *files, "--budget", "0", "-n", "4", env=env))
        == "dspark: error: --budget must be >= 1 (got 0)"
    )


def test_a_default_budget_is_clamped_to_the_draft_and_said(engine, block4, cli, tmp_path):
    assert draft_limit(block4.draft).most == 4
    env, files = _env(engine, tmp_path), ["--target", str(block4.target), "--draft", str(block4.draft)]
    said = (
        f"budget 4: the default 5 is more than the draft proposes per step, at most 4 (block size 4, "
        f"{block4.draft.name}) (--budget N sets it)"
    )
    proc = cli("run", *files, "hello there", "-n", "12", "-t", "1", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stderr and json.loads(proc.stdout)["budget"] == 4
    argv = json.loads(proc.stdout)["server_argv"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    proc = cli("serve", *files, "--print", "--json", env=env)
    assert proc.returncode == 0 and said in proc.stderr, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    proc = cli(
        "bench",
        *files,
        "--prompts",
        str(_prompts(tmp_path)),
        "-n",
        "8",
        "--reps",
        "1",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--json",
        "--out",
        str(tmp_path / "b.jsonl"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stderr
    assert {s["budget"] for s in json.loads(proc.stdout)["summaries"]} == {None, 4}
    proc = cli("run", *files, "hi", "-n", "4", "--budget", "5", env=env)  # given, it is refused instead
    assert "--budget 5 is above what the draft proposes per step: at most 4" in _one_error(proc)


def test_the_engine_caps_a_request_budget_above_the_servers_silently(engine, block8, tmp_path):
    """What README says other clients get: a request's speculative.n_max above the server's is capped at the
    server's (the same drafts as asking for it) and echoed as sent; only the empty probe says the truth."""
    man = synth.load_manifest(block8.manifest)
    cfg = ServerConfig(model=block8.target, draft=block8.draft, n_max=5, ctx=1024, threads=1)
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        asked = {
            n: srv.client.completion(
                protocol.completion_payload(
                    [1, 2, 3], n_predict=40, response_fields=None, draft=protocol.draft_settings(n_max=n)
                )
            )
            for n in (5, 7)
        }
        probe = srv.client.completion(dict(protocol.SETTINGS_PROBE))
    pred = synth.predict(man, [1, 2, 3], n_max=5, n_predict=40)
    for n, resp in asked.items():
        assert protocol.timings_drafts(resp["timings"]) == (pred.draft_n, pred.draft_n_accepted), n
        assert resp["generation_settings"][protocol.SPEC_N_MAX] == n  # 7 echoed, 5 drafted
    assert protocol.ServedBudget.from_settings(probe["generation_settings"]) == protocol.ServedBudget(5, False)
    assert probe["tokens_evaluated"] == 0


def test_run_against_a_server_refuses_a_budget_above_its_own(engine, block8, cli, tmp_path):
    man = synth.load_manifest(block8.manifest)
    cfg = ServerConfig(model=block8.target, draft=block8.draft, n_max=5, ctx=1024, threads=1)
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        proc = cli("run", "--server", srv.url, "hello there", "--budget", "7", "-n", "30")
        assert _one_error(proc) == (
            "dspark: error: --budget 7 is above this server's budget 5 (its --spec-draft-n-max): llama-server would "
            "draft at most 5; ask for at most 5, or serve with --budget 7"
        )
        assert proc.stdout == ""  # nothing was asked
        last = synth.last_prompt_token(man, srv.client.apply_template(protocol.build_messages("hello there")))
        for flags, budget in ((("--budget", "3"), 3), ((), 5)):
            proc = cli("run", "--server", srv.url, "hello there", "-n", "30", *flags)
            assert proc.returncode == 0, proc.stderr
            pred = synth.predict_from_last(man, last, n_max=5, n_predict=30, request_n_max=budget)
            assert proc.stdout.strip() == pred.text.strip()
            stats = proc.stderr.strip().splitlines()[-1]
            assert f"budget {budget} | drafted {pred.draft_n} | accepted {pred.draft_n_accepted}" in stats, stats
            assert "set by the server" not in stats
