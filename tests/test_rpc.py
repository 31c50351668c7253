"""Through llama.cpp's RPC backend: two real ggml-rpc-server workers on 127.0.0.1 and the synthetic pair.

The target is split across the two workers (llama-server's log shows a model buffer on each), the draft
goes on the worker with the target's output layer, and every token and drafted / accepted count equals
the known-answer prediction, for run and for bench. A worker killed mid-request is one line, no hang,
no orphan; a draft placed where the pinned engine would abort is refused before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_server import _children_named, _wait_for

from dsparkcli.bench import prompts
from dsparkcli.errors import EngineCapabilityError, UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import protocol
from dsparkcli.llama.rpc import RpcWorker, WorkerConfig
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.chat_oracle import expected_chat

N = 40
BUDGET = 5
PROMPT = "Say something"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("rpc-pair"), vocab=128, accept_rate=0.7, seed=11)


@pytest.fixture(scope="module")
def workers(engine, tmp_path_factory):
    """Two workers for the whole module (each serves one llama-server at a time, in turn)."""
    assert engine_mod.supports_rpc(engine), "make test builds the engine with the RPC backend"
    logs = tmp_path_factory.mktemp("rpc-logs")
    with (
        RpcWorker(engine, WorkerConfig(threads=1), log_dir=logs) as w1,
        RpcWorker(engine, WorkerConfig(threads=1), log_dir=logs) as w2,
    ):
        yield w1, w2


def _rpc(workers) -> str:
    return ",".join(str(w.endpoint) for w in workers)


def _env(engine) -> dict[str, str]:
    return {"DSPARK_LLAMA_BIN": str(engine.bin_dir)}


@pytest.fixture(scope="module")
def expected(engine, pair):
    man = synth.load_manifest(pair.manifest)
    with LlamaServer(engine, ServerConfig(model=pair.target, threads=1, ctx=1024)) as srv:
        pred = expected_chat(srv.client, man, protocol.build_messages(PROMPT, []), n_max=BUDGET, n_predict=N)
    assert pred.draft_n > pred.draft_n_accepted > 0
    return pred


@pytest.mark.parametrize(("split", "holder"), [(None, "RPC1"), ("1,0", "RPC0")])
def test_run_through_two_workers_gives_the_predicted_answer(cli, engine, pair, workers, expected, split, holder):
    """The draft lands on the worker with the target's output layer: the last one by default, the first
    when --tensor-split 1,0 gives it the whole target (a draft elsewhere would abort the engine)."""
    extra = ["--tensor-split", split] if split else []
    proc = cli(
        "run",
        PROMPT,
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--budget",
        str(BUDGET),
        "-n",
        str(N),
        "-t",
        "1",
        "--ctx",
        "1024",
        "--rpc",
        _rpc(workers),
        "--json",
        *extra,
        env=_env(engine),
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["text"] == expected.text
    assert (rec["drafted"], rec["accepted"], rec["steps"]) == (
        expected.draft_n,
        expected.draft_n_accepted,
        expected.steps,
    )
    argv = rec["server_argv"]
    assert argv[argv.index("--rpc") + 1] == _rpc(workers)
    assert argv[argv.index("-devd") + 1] == holder


def test_the_target_really_lands_on_both_workers(engine, pair, workers, tmp_path):
    from dsparkcli.llama.placement import Placement

    cfg = ServerConfig(
        model=pair.target,
        draft=pair.draft,
        n_max=BUDGET,
        threads=1,
        ctx=1024,
        placement=Placement(rpc=tuple(w.endpoint for w in workers), draft_device="RPC1"),
        extra_args=("-lv", "4"),
    )  # load_tensors' buffer lines are info at verbosity 4
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        resp = srv.client.completion({"prompt": [1, 2, 3], "n_predict": N, "temperature": 0, "return_tokens": True})
        log = srv.log_path.read_text()
    pred = synth.predict(synth.load_manifest(pair.manifest), [1, 2, 3], n_max=BUDGET, n_predict=N)
    assert resp["tokens"] == list(pred.tokens)
    assert (resp["timings"]["draft_n"], resp["timings"]["draft_n_accepted"]) == (pred.draft_n, pred.draft_n_accepted)
    for w in workers:  # ggml-rpc names each buffer after its worker's endpoint
        assert f"[{w.endpoint}] model buffer size" in log, w.endpoint


def test_inspect_per_device_bytes_match_the_real_buffers(engine, pair, workers, tmp_path):
    """The pure layer split (inspect --tensor-split) against llama-server's own buffer lines, per worker."""
    from dsparkcli.inspect import inspect_files
    from dsparkcli.llama.placement import Placement

    split = (1.0, 3.0)
    cfg = ServerConfig(
        model=pair.target,
        threads=1,
        ctx=1024,
        extra_args=("-lv", "4"),
        placement=Placement(rpc=tuple(w.endpoint for w in workers), tensor_split=split),
    )
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        log = srv.log_path.read_text()
    report = inspect_files([str(pair.target)], ctx=1024, tensor_split=split, auto_expect=False)
    shares = {s.device: s for s in report.files[0].devices}

    def mib(kind: str, w) -> float:
        m = re.search(rf"RPC\d\[{re.escape(str(w.endpoint))}\] {kind} buffer size = +([0-9.]+) MiB", log)
        return float(m.group(1)) if m else 0.0

    for i, w in enumerate(workers):
        assert abs(mib("model", w) - shares[str(i)].weights_bytes / 2**20) < 0.01, (i, shares[str(i)])
        assert abs(mib("KV", w) - shares[str(i)].kv_bytes / 2**20) < 0.01, (i, shares[str(i)])
    assert shares["1"].kv_bytes > 0 and shares["0"].kv_bytes > 0  # 1:3 puts a layer on each worker
    cpu = re.search(r"CPU_Mapped model buffer size = +([0-9.]+) MiB", log)
    assert cpu and abs(float(cpu.group(1)) - shares["host"].weights_bytes / 2**20) < 0.01


def test_bench_through_two_workers_equals_the_prediction(cli, engine, pair, workers, tmp_path):
    chosen = prompts.select(prompts.load_prompts(), ["text"], limit=1)
    man = synth.load_manifest(pair.manifest)
    with LlamaServer(engine, ServerConfig(model=pair.target, threads=1, ctx=1024)) as srv:
        preds = {p.id: expected_chat(srv.client, man, p.messages(), n_max=BUDGET, n_predict=N) for p in chosen}
    out = tmp_path / "bench.jsonl"
    proc = cli(
        "bench",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--budget",
        str(BUDGET),
        "--category",
        "text",
        "--limit",
        "1",
        "--reps",
        "1",
        "--warmup",
        "0",
        "-n",
        str(N),
        "-t",
        "1",
        "--ctx",
        "1024",
        "--rpc",
        _rpc(workers),
        "--json",
        "--out",
        str(out),
        env=_env(engine),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "draft on RPC1" in proc.stderr
    rows = {(s["config"], s["category"]): s for s in json.loads(proc.stdout)["summaries"]}
    row = rows[(f"draft-dspark@{BUDGET}", "all")]
    assert (row["drafted"], row["accepted"], row["steps"]) == (
        sum(p.draft_n for p in preds.values()),
        sum(p.draft_n_accepted for p in preds.values()),
        sum(p.steps for p in preds.values()),
    )
    assert row["identical"] == row["prompts"] == len(chosen)
    requests = [r for r in map(json.loads, out.read_text().splitlines()) if r["record"] == "request"]
    assert len(requests) == 2 * len(chosen)
    for r in requests:
        assert r["tokens"] == list(preds[r["prompt_id"]].tokens), (r["config"], r["prompt_id"])
        assert "--rpc" in r["server_argv"]


def test_draft_on_another_device_is_refused_before_anything_starts(cli, engine, pair, workers):
    proc = cli(
        "run",
        PROMPT,
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "-n",
        "4",
        "--rpc",
        _rpc(workers),
        "--draft-device",
        "RPC0",
        env=_env(engine),
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dspark: error: --draft-device RPC0: the DSpark draft borrows the target's output layer")
    assert "RPC1" in last and "Traceback" not in proc.stderr
    assert "loading" not in proc.stderr  # no server was started


def test_serve_print_shows_where_the_draft_went(cli, engine, pair, workers):
    proc = cli(
        "serve",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--rpc",
        _rpc(workers),
        "--tensor-split",
        "1,0",
        "--print",
        "--json",
        env=_env(engine),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    # 1,0: the whole target on the first worker, so the draft goes there too
    assert argv[argv.index("-ts") + 1] == "1,0" and argv[argv.index("-devd") + 1] == "RPC0"


def test_split_row_over_rpc_is_refused(cli, engine, pair, workers):
    proc = cli(
        "run",
        PROMPT,
        "--target",
        str(pair.target),
        "--rpc",
        _rpc(workers),
        "--split-mode",
        "row",
        env=_env(engine),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("dspark: error: --split-mode row splits weight rows")


@pytest.mark.timing  # a wall-clock bound
def test_worker_killed_mid_request_is_one_line_no_hang_no_orphan(engine, pair, tmp_path):
    """Two `dspark rpc-worker` processes and a long `dspark run`; SIGKILL one worker while tokens stream."""
    env = {**os.environ, "DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "dsparkcli.cli.app"]
    procs = [
        subprocess.Popen(
            [*cmd, "rpc-worker", "--port", "0", "--threads", "1", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    run = None
    try:
        infos = [json.loads("".join(iter(p.stdout.readline, "}\n")) + "}") for p in procs]
        run = subprocess.Popen(
            [
                *cmd,
                "run",
                "go on",
                "--target",
                str(pair.target),
                "--draft",
                str(pair.draft),
                "-n",
                "4000",
                "--ctx",
                "4096",
                "-t",
                "1",
                "--rpc",
                ",".join(i["endpoint"] for i in infos),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        server = _wait_for(lambda: _children_named(run.pid, "llama-server"), 60, "llama-server")[0]
        assert run.stdout.read(8)  # tokens are streaming through the workers
        os.kill(infos[1]["pid"], signal.SIGKILL)  # the worker process itself, not dspark's supervisor
        t0 = time.monotonic()
        run.wait(timeout=60)
        assert time.monotonic() - t0 < 30
        stderr = run.stderr.read()
        assert run.returncode == 4, stderr
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("dspark: error: llama-server failed during generation")
        assert "an RPC worker is unreachable or died" in last and "Traceback" not in stderr
        assert not Path(f"/proc/{server}").exists()  # llama-server is gone, reaped
        # the supervisor of the killed worker says so in one line and exits; the other keeps serving
        procs[1].wait(timeout=30)
        assert procs[1].returncode == 4
        assert procs[1].stderr.read().strip().splitlines()[-1].startswith("dspark: error: rpc worker")
        assert procs[0].poll() is None and Path(f"/proc/{infos[0]['pid']}").exists()
    finally:
        for p in [run, *procs]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    assert not Path(f"/proc/{infos[0]['pid']}").exists()  # SIGTERM to dspark stops its worker too


def test_sigkilled_supervisor_leaves_no_worker(engine, tmp_path):
    env = {**os.environ, "DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", "rpc-worker", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    info = json.loads("".join(iter(proc.stdout.readline, "}\n")) + "}")
    proc.kill()
    proc.wait()
    _wait_for(
        lambda: (
            not Path(f"/proc/{info['pid']}").exists()
            or "Z" in Path(f"/proc/{info['pid']}/stat").read_text().split()[2]
        ),
        10,
        "the worker to die with dspark",
    )


def test_worker_port_in_use_is_one_line(cli, engine, workers):
    taken = workers[0].port
    proc = cli("rpc-worker", "--port", str(taken), env=_env(engine), timeout=60)
    assert proc.returncode == 4, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dspark: error: rpc worker 127.0.0.1:{taken} failed during start")
    assert "port" in last


def test_a_second_worker_on_a_busy_port_keeps_the_first_log(engine, tmp_path):
    """Issue 28 item 8: the second worker wrote over the first's log, so the first one's later death was
    blamed on "the port is already in use". Each launch has a log of its own; each death names its own."""
    env = {**os.environ, "DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "dsparkcli.cli.app", "rpc-worker", "--threads", "1"]
    first = subprocess.Popen(
        [*cmd, "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        info = json.loads("".join(iter(first.stdout.readline, "}\n")) + "}")
        log = Path(info["log"])
        before = log.read_bytes()
        port = info["endpoint"].rsplit(":", 1)[1]
        second = subprocess.run([*cmd, "--port", port], capture_output=True, text=True, env=env, timeout=60)
        last = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 4 and "the port is already in use" in last, second.stderr
        second_log = Path(re.search(r"\(log: (\S+)\)$", last).group(1))
        assert second_log != log and b"Failed to create server socket" in second_log.read_bytes()
        after = log.read_bytes()
        assert after.startswith(before) and b"Failed to create server socket" not in after
        os.kill(info["pid"], signal.SIGKILL)  # the first worker dies: its own log, its own cause
        first.wait(timeout=30)
        last = first.stderr.read().strip().splitlines()[-1]
        assert first.returncode == 4 and last.startswith(
            f"dspark: error: rpc worker {info['endpoint']} failed during serving (signal 9)"
        ), last
        assert "already in use" not in last and last.endswith(f"(log: {log})") and log.is_file()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_non_loopback_worker_needs_the_flag_and_warns(cli, tmp_path):
    proc = cli("rpc-worker", "--host", "0.0.0.0")
    assert proc.returncode == 2
    assert "RPC has no authentication" in proc.stderr and "--allow-remote" in proc.stderr
    # with the flag: the warning, then (here) the missing engine; nothing was bound
    proc = cli("rpc-worker", "--host", "0.0.0.0", "--allow-remote", "--llama-bin", str(tmp_path / "none"))
    assert proc.returncode == 3
    assert proc.stderr.startswith("warning: the RPC worker on 0.0.0.0 has no authentication")


def test_engine_without_rpc_is_refused_before_any_file_is_read(tmp_path):
    """A llama-server built without GGML_RPC says so only when --rpc is used: dspark asks it first."""
    fake = tmp_path / "bin"
    fake.mkdir()
    server = fake / "llama-server"
    server.write_text(
        "#!/bin/sh\necho 'error while handling argument \"--rpc\": RPC not supported in this build' >&2\nexit 1\n"
    )
    server.chmod(0o755)
    with pytest.raises(EngineCapabilityError, match="built without the RPC backend"):
        engine_mod.resolve_engine(str(fake), rpc=True)
    assert engine_mod.resolve_engine(str(fake)).server == server  # without --rpc nothing is asked


def test_worker_config_refuses_a_remote_host_in_the_api_too(engine):
    with pytest.raises(UsageError, match="--allow-remote"):
        RpcWorker(engine, WorkerConfig(host="10.1.2.3")).start()


def test_the_gpu_check_script_runs_here_on_the_cpu_engine(engine, tmp_path, monkeypatch):
    """study/rpc_check.py (the H200 check) on the CPU engine: direct and through a local worker, the
    same tokens and counts, both equal to the known-answer prediction, a tok/s ratio recorded."""
    from support.scripts import script

    monkeypatch.setenv("DSPARK_LLAMA_BIN", str(engine.bin_dir))
    out = tmp_path / "rpc.jsonl"
    rc = script("rpc_check").main(
        [
            "--synth",
            str(tmp_path / "ka"),
            "--out",
            str(out),
            "--n-predict",
            "32",
            "--prompts",
            "2",
            "--reps",
            "1",
            "--threads",
            "1",
            "--log-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["record"] for r in records] == ["provenance"] + ["request"] * 4 + ["summary"]
    s = records[-1]
    assert s["tokens_equal"] is s["counts_equal"] is s["predicted"] is True
    assert s["ratio"] == s["rpc_tok_s"]["median"] / s["direct_tok_s"]["median"] > 0
    assert "--rpc" in s["rpc_argv"] and s["rpc_argv"][s["rpc_argv"].index("-devd") + 1] == "RPC0"
    assert "--rpc" not in s["direct_argv"]


def test_the_gpu_check_script_sets_synthetic_acceptance_itself(engine, pair, tmp_path, monkeypatch):
    """--synth-len goes into the ServerConfig (a `-- --spec-synth-len` is refused by dspark's own checks,
    which is how the H200 stand-in check failed): both paths get it, and still agree."""
    from support.scripts import script

    monkeypatch.setenv("DSPARK_LLAMA_BIN", str(engine.bin_dir))
    out = tmp_path / "rpc.jsonl"
    rc = script("rpc_check").main(
        [
            "--target",
            str(pair.target),
            "--draft",
            str(pair.draft),
            "--synth-len",
            "2.5",
            "--out",
            str(out),
            "--n-predict",
            "32",
            "--prompts",
            "1",
            "--reps",
            "1",
            "--threads",
            "1",
            "--log-dir",
            str(tmp_path),
        ]
    )
    s = json.loads(out.read_text().splitlines()[-1])
    assert rc == 0 and s["tokens_equal"] is s["counts_equal"] is True and s["predicted"] is None
    for argv in (s["direct_argv"], s["rpc_argv"]):
        assert argv[argv.index("--spec-synth-len") + 1] == "2.5"


def test_the_gpu_check_script_checks_the_target_alone(engine, pair, tmp_path, monkeypatch):
    from support.scripts import script

    monkeypatch.setenv("DSPARK_LLAMA_BIN", str(engine.bin_dir))
    out = tmp_path / "rpc.jsonl"
    rc = script("rpc_check").main(
        [
            "--target",
            str(pair.target),
            "--no-draft",
            "--out",
            str(out),
            "--n-predict",
            "24",
            "--prompts",
            "2",
            "--reps",
            "1",
            "--threads",
            "1",
            "--log-dir",
            str(tmp_path),
        ]
    )
    s = json.loads(out.read_text().splitlines()[-1])
    assert rc == 0 and s["tokens_equal"] is True and s["draft"] is None
    assert s["first_divergence"] == {"0": None, "1": None}
    assert "-md" not in s["rpc_argv"] and "-devd" not in s["rpc_argv"]
