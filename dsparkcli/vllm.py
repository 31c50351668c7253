"""The vLLM recipe: a registry pair as ``vllm serve`` with DSpark speculative decoding (several GPUs).

The upstream model card (seed 004) serves MiniCPM-V 4.7 with vLLM at tensor parallel 2, max model
len 40960, FLASH_ATTN for the language model and the vision encoder, thinking off, one sequence at a
time, custom all-reduce and its fusion pass off, and a speculative config on the DSpark safetensors
checkpoint with adaptive verification off. ``serve_command`` writes that line from the pair's
``[pairs.<name>.vllm]`` table; every flag and every speculative-config key is one vLLM documents
(tests/support/vllm_docs.py cites where). The card's 4x visual downsampling has no documented vLLM
option name in the sources, so it is not guessed: pass it after ``--`` if your vLLM has one.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsparkcli.errors import ServerError, UsageError
from dsparkcli.hub.registry import ModelPair
from dsparkcli.llama.server import die_with_parent, stop_process

# vLLM's name for the method (vllm/config/speculative.py: DSparkModelTypes = Literal["dspark"]); earlier
# releases only had "dflash", which runs the block drafter without DSpark's Markov and confidence heads
METHOD = "dspark"
ATTENTION_BACKEND = "FLASH_ATTN"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads the key from here: it never appears in argv or in a printed line


@dataclass(frozen=True)
class VllmCommand:
    argv: tuple[str, ...]
    speculative_config: dict[str, object]
    env: dict[str, str] = field(default_factory=dict, repr=False)  # the API key: shown by name only

    def shell_line(self, key_from: str = '"$DSPARK_API_KEY"') -> str:
        """The command as one pasteable shell line; an API key is never written out: ``key_from`` is a shell
        word that yields it (the caller knows where the key came from)."""
        prefix = f"{API_KEY_ENV}={key_from} " if API_KEY_ENV in self.env else ""
        return prefix + shlex.join(self.argv)

    def to_record(self, key_from: str = '"$DSPARK_API_KEY"') -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "speculative_config": self.speculative_config,
            "env": sorted(self.env),
            "shell": self.shell_line(key_from),
        }


def serve_command(
    pair: ModelPair,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    budget: int | None = None,
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
) -> VllmCommand:
    """``vllm serve`` for ``pair`` with its DSpark draft; ``budget`` overrides num_speculative_tokens."""
    recipe = pair.vllm
    if recipe is None:
        raise UsageError(
            f"pair {pair.name} has no [pairs.{pair.name}.vllm] table (the hub ids of its safetensors "
            "target and DSpark draft): add one to your models.toml to serve it with vLLM"
        )
    n_spec = budget or recipe.num_speculative_tokens or pair.budget
    spec: dict[str, object] = {
        "method": METHOD,
        "model": recipe.draft,
        "num_speculative_tokens": n_spec,
        "enable_adaptive_verification": False,
    }
    if recipe.draft_revision:
        spec["revision"] = recipe.draft_revision
    argv = ["vllm", "serve", recipe.target, "--host", host, "--port", str(port)]
    if recipe.target_revision:
        argv += ["--revision", recipe.target_revision]
    argv += ["--tensor-parallel-size", str(recipe.tensor_parallel_size)]
    if recipe.max_model_len:
        argv += ["--max-model-len", str(recipe.max_model_len)]
    argv += [
        "--attention-backend",
        ATTENTION_BACKEND,
        "--mm-encoder-attn-backend",
        ATTENTION_BACKEND,
        "--max-num-seqs",
        "1",
        "--disable-custom-all-reduce",
        "--compilation-config",
        json.dumps({"pass_config": {"fuse_allreduce_rms": False}}),
        "--default-chat-template-kwargs",
        json.dumps({"enable_thinking": False}),
        "--speculative-config",
        json.dumps(spec),
        *extra_args,
    ]
    env = {API_KEY_ENV: api_key} if api_key else {}
    return VllmCommand(argv=tuple(argv), speculative_config=spec, env=env)


def run(cmd: VllmCommand) -> int:
    """Run vLLM as a supervised child until it exits or Ctrl-C (then SIGTERM, SIGKILL after 10 s)."""
    exe = shutil.which(cmd.argv[0])
    if exe is None:
        raise UsageError(
            "vllm is not installed here (pip install vllm on the GPU machine); "
            "`dspark serve --engine vllm --print` shows the command to run there"
        )
    proc = subprocess.Popen(
        [exe, *cmd.argv[1:]], env={**os.environ, **cmd.env}, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
    )
    try:
        rc = proc.wait()
    finally:
        stop_process(proc, grace=10.0)  # Ctrl-C: vLLM's own shutdown first, then SIGKILL
    if rc != 0:
        raise ServerError(f"vllm serve exited with code {rc} (its own output above says why)", kind="crash")
    return rc
