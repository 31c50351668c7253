"""`dspark serve --engine vllm`: seed 004's recipe, every flag and speculative-config key one vLLM documents.

No vLLM here: the generated argv is parsed back flag by flag against tests/support/vllm_docs.py (what
vLLM's config classes and docs define), and the recipe's values are checked against the model card's.
"""

from __future__ import annotations

import json
import shlex

import pytest

from dsparkcli import vllm
from dsparkcli.errors import UsageError
from dsparkcli.hub.registry import load_registry
from support.vllm_docs import (
    ATTENTION_BACKENDS,
    PASS_CONFIG_FIELDS,
    SERVE_FLAGS,
    SPECULATIVE_FIELDS,
    SPECULATIVE_METHODS,
)


def _parse(argv: tuple[str, ...]) -> dict[str, object]:
    """argv after `vllm serve MODEL` -> {flag: value}, each value checked against its documented kind."""
    assert argv[:2] == ("vllm", "serve")
    opts: dict[str, object] = {"model": argv[2]}
    i = 3
    while i < len(argv):
        flag = argv[i]
        assert flag in SERVE_FLAGS, f"{flag} is not a documented vllm serve option"
        assert flag not in opts, f"{flag} given twice"
        _, kind = SERVE_FLAGS[flag]
        if kind == "flag":
            opts[flag], i = True, i + 1
            continue
        value = argv[i + 1]
        if kind == "int":
            opts[flag] = int(value)
        elif kind == "json":
            opts[flag] = json.loads(value)
            assert isinstance(opts[flag], dict), flag
        elif kind == "attention-backend":
            assert value in ATTENTION_BACKENDS, (flag, value)
            opts[flag] = value
        else:
            opts[flag] = value
        i += 2
    return opts


def test_the_registry_pair_becomes_the_model_cards_recipe():
    pair = load_registry().get("minicpm-v-4.7")
    cmd = vllm.serve_command(pair, port=8000)
    opts = _parse(cmd.argv)
    assert opts["model"] == "openbmb/MiniCPM-V-4.7-35B-A3B"
    assert opts["--tensor-parallel-size"] == 2 and opts["--max-model-len"] == 40960
    assert opts["--attention-backend"] == opts["--mm-encoder-attn-backend"] == "FLASH_ATTN"
    assert opts["--max-num-seqs"] == 1 and opts["--disable-custom-all-reduce"] is True
    assert opts["--compilation-config"] == {"pass_config": {"fuse_allreduce_rms": False}}
    assert set(opts["--compilation-config"]["pass_config"]) <= PASS_CONFIG_FIELDS  # type: ignore[index]
    assert opts["--default-chat-template-kwargs"] == {"enable_thinking": False}
    assert (opts["--host"], opts["--port"]) == ("127.0.0.1", 8000)
    spec = opts["--speculative-config"]
    assert (
        spec
        == cmd.speculative_config
        == {
            "method": "dspark",
            "model": "openbmb/MiniCPM-V-4.7-35B-A3B-DSpark",
            "num_speculative_tokens": 15,
            "enable_adaptive_verification": False,
            "revision": "5facb75c",
        }
    )


def test_the_speculative_config_uses_only_documented_keys_and_types():
    spec = vllm.serve_command(load_registry().get("minicpm-v-4.7")).speculative_config
    for key, value in spec.items():
        assert key in SPECULATIVE_FIELDS, key
        assert isinstance(value, SPECULATIVE_FIELDS[key]), (key, value)
    assert spec["method"] in SPECULATIVE_METHODS
    assert spec["num_speculative_tokens"] >= 1  # SpeculativeConfig: Field(gt=0)


def test_budget_overrides_the_registry_and_extra_args_go_last():
    cmd = vllm.serve_command(
        load_registry().get("minicpm-v-4.7"), budget=7, extra_args=("--gpu-memory-utilization", "0.85")
    )
    assert cmd.speculative_config["num_speculative_tokens"] == 7
    assert cmd.argv[-2:] == ("--gpu-memory-utilization", "0.85")


def test_the_api_key_is_never_written_out():
    cmd = vllm.serve_command(load_registry().get("minicpm-v-4.7"), api_key="s3cret-key")
    assert "s3cret-key" not in " ".join(cmd.argv) and "s3cret-key" not in cmd.shell_line()
    assert "s3cret-key" not in json.dumps(cmd.to_record()) and "s3cret-key" not in repr(cmd)
    assert cmd.env == {"VLLM_API_KEY": "s3cret-key"}
    assert cmd.shell_line().startswith('VLLM_API_KEY="$DSPARK_API_KEY" vllm serve ')
    assert shlex.split(cmd.shell_line())[1:] == list(cmd.argv)


GGUF_ONLY = (
    '[pairs.tiny]\n[pairs.tiny.target]\nrepo="a/b"\nfilename="t.gguf"\n[pairs.tiny.drafts.d]\nrepo="a/b"\n'
    'filename="d.gguf"\n'
)


def test_a_pair_without_a_vllm_table_is_one_line(user_models, monkeypatch):
    monkeypatch.setenv("DSPARK_CONFIG_DIR", str(user_models(GGUF_ONLY)))
    with pytest.raises(UsageError, match=r"has no \[pairs.tiny.vllm\] table"):
        vllm.serve_command(load_registry().get("tiny"))


def test_models_toml_vllm_table_is_validated(user_models, cli):
    bad = GGUF_ONLY + '[pairs.tiny.vllm]\ntarget="a/b"\ndraft="nope"\n'
    proc = cli("serve", "tiny", "--engine", "vllm", "--print", env={"DSPARK_CONFIG_DIR": str(user_models(bad))})
    assert proc.returncode == 2
    assert "pairs.tiny.vllm.draft: 'nope' is not a hub repo id" in proc.stderr


def test_serve_print_and_json(cli):
    proc = cli("serve", "minicpm-v-4.7", "--engine", "vllm", "--print", "--port", "8000")
    assert proc.returncode == 0, proc.stderr
    assert shlex.split(proc.stdout.strip())[:3] == ["vllm", "serve", "openbmb/MiniCPM-V-4.7-35B-A3B"]
    proc = cli("serve", "--engine", "vllm", "--print", "--json", "--budget", "15")
    doc = json.loads(proc.stdout)
    _parse(tuple(doc["argv"]))
    assert doc["speculative_config"]["num_speculative_tokens"] == 15 and doc["env"] == []


def test_llama_only_options_are_refused_with_vllm(cli):
    proc = cli("serve", "--engine", "vllm", "--print", "--ctx", "4096", "--rpc", "127.0.0.1:50052")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "dspark: error: --ctx, --rpc: llama.cpp options; --engine vllm serves a registry "
        "pair's safetensors with the model card's recipe (vLLM flags go after --)"
    )


def test_running_without_vllm_installed_is_one_line(cli, tmp_path):
    proc = cli("serve", "--engine", "vllm", env={"PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("dspark: error: vllm is not installed here")
