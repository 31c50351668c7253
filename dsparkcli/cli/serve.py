"""`dspark serve [NAME]`: keep one llama-server with the DSpark draft up, OpenAI-compatible, supervised."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import (
    API_KEY_ENV,
    ApiKeyFileOpt,
    ApiKeyOpt,
    AutoPMinOpt,
    BudgetOpt,
    CategoryOpt,
    CtxOpt,
    DraftDeviceOpt,
    DraftKeyOpt,
    DraftOpt,
    HostOpt,
    JsonOpt,
    LlamaBinOpt,
    MainGpuOpt,
    MmprojOpt,
    NglOpt,
    NoDraftOpt,
    PortOpt,
    RpcOpt,
    SpecOpt,
    SplitModeOpt,
    TargetOpt,
    TensorSplitOpt,
    ThreadsOpt,
    YesOpt,
    api_key_from,
    knob_values,
    passthrough_args,
    placement_of,
)
from dsparkcli.cli._download import confirm_downloads, download_progress
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.errors import UsageError
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import hazards, speculation
from dsparkcli.llama.placement import describe as placement_describe
from dsparkcli.llama.placement import is_loopback
from dsparkcli.llama.server import require_free_port
from dsparkcli.llama.supervise import DEFAULT_MAX_RESTARTS, Event, Supervisor
from dsparkcli.pairs import Downloads, PairSpec, ServerKnobs, check_given, check_plain, prepare_server

HELP = """Serve a target + DSpark draft (+ vision projector) until Ctrl-C or SIGTERM.

OpenAI-compatible (/v1/chat/completions). Binds 127.0.0.1 unless --host says otherwise; a
non-loopback host requires an API key: DSPARK_API_KEY or --api-key-file (--api-key works but shows
the key to every user in `ps`). Ask it with `dspark run --server URL` so a large model is
loaded once. --parallel N decodes N requests at once (llama-server -np N; --ctx is per request).
If llama-server dies, serve says why (its last log lines), restarts it on the same port with
backoff (0.5, 1, 2, 4, 8 s) and says when it is healthy again; --max-restarts failures in a row
end it (exit 4). Ctrl-C or SIGTERM stop llama-server and end serve normally ("stopped",
exit 0; during loading they interrupt it: exit 130). --engine vllm serves a registry pair's
safetensors target and DSpark draft with vLLM instead (its [pairs.NAME.vllm] table in models.toml);
--print shows the server command instead of running it, runnable as printed: the API key is
passed as serve passes it, from $DSPARK_API_KEY or the key file, never written out.

\b
Examples:
  dspark serve minicpm-v-4.7 --port 8080
  dspark serve minicpm-v-4.7 --parallel 4 --ctx 4096     # four users at once, 4096 tokens each
  dspark serve --target t.gguf --draft d.gguf --mmproj mm.gguf --budget 5
  dspark serve minicpm-v-4.7 --budget auto --p-min auto   # what `dspark tune` chose on this machine
  DSPARK_API_KEY="$KEY" dspark serve minicpm-v-4.7 --host 0.0.0.0 -- -ngl 99 -fa on
  dspark serve minicpm-v-4.7 --host 0.0.0.0 --api-key-file ~/.config/dspark/key
  dspark serve minicpm-v-4.7 --rpc 10.0.0.2:50052,10.0.0.3:50052   # target on two rpc workers
  dspark serve minicpm-v-4.7 --engine vllm --print  # the model card's vLLM line (tensor parallel 2)
  dspark serve minicpm-v-4.7 --engine vllm --port 8000             # ... and run it, if vllm is installed
"""


def serve(
    name: Annotated[Optional[str], typer.Argument(help="Pair name from models.toml.")] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    mmproj: MmprojOpt = None,
    draft_key: DraftKeyOpt = None,
    budget: BudgetOpt = None,
    no_draft: NoDraftOpt = False,
    spec: SpecOpt = None,
    p_min: AutoPMinOpt = None,
    category: CategoryOpt = None,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    ngl: NglOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    parallel: Annotated[int, typer.Option("--parallel", "-np", min=1, help="Requests decoded at once (-np).")] = 1,
    max_restarts: Annotated[
        int, typer.Option("--max-restarts", min=0, help="Restarts in a row before giving up.")
    ] = DEFAULT_MAX_RESTARTS,
    api_key: ApiKeyOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    rpc: RpcOpt = None,
    split_mode: SplitModeOpt = None,
    tensor_split: TensorSplitOpt = None,
    main_gpu: MainGpuOpt = None,
    draft_device: DraftDeviceOpt = None,
    engine_name: Annotated[
        str,
        typer.Option(
            "--engine", metavar="llama|vllm", help="llama.cpp (default), or vLLM for a registry pair on several GPUs."
        ),
    ] = "llama",
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the server command instead of running it.")
    ] = False,
    yes: YesOpt = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    api_key = api_key_from(api_key, api_key_file)
    if not is_loopback(host) and not api_key:
        raise UsageError(
            f"--host {host} exposes the server beyond this machine: set DSPARK_API_KEY or give --api-key-file"
        )
    if engine_name not in ("llama", "vllm"):
        raise UsageError(f"--engine must be llama or vllm (got {engine_name})")
    if engine_name == "vllm":
        llama_only = {
            "--target": target,
            "--draft": draft,
            "--mmproj": mmproj,
            "--draft-key": draft_key,
            "--no-draft": no_draft or None,
            "--spec": spec,
            "--p-min": p_min,
            "--ctx": ctx,
            "--threads": threads,
            "--ngl": ngl,
            "--parallel": parallel if parallel != 1 else None,
            "--category": category,
            "--rpc": rpc,
            "--split-mode": split_mode,
            "--tensor-split": tensor_split,
            "--main-gpu": main_gpu,
            "--draft-device": draft_device,
            "--llama-bin": llama_bin,
        }
        given = [flag for flag, value in llama_only.items() if value is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)}: llama.cpp options; --engine vllm serves a registry pair's "
                "safetensors with the model card's recipe (vLLM flags go after --)"
            )
        kv = knob_values(budget, None)
        if kv["auto_budget"] or kv["adaptive_budget"]:
            raise UsageError(
                "--budget auto and adaptive are dspark tune's for llama.cpp; give vLLM a number "
                "(default: the registry's num_speculative_tokens)"
            )
        from dsparkcli import vllm

        cmd = vllm.serve_command(
            load_registry().get(name),
            host=host,
            port=port,
            budget=kv["budget"],
            api_key=api_key,
            extra_args=passthrough_args(),
        )
        if not print_only:
            vllm.run(cmd)
        elif json_out:
            print_json(cmd.to_record(_key_word(api_key, api_key_file)))
        else:
            out.print(cmd.shell_line(_key_word(api_key, api_key_file)), markup=False)
        return
    placement = placement_of(rpc, split_mode, tensor_split, main_gpu, draft_device)
    kv = knob_values(budget, p_min)
    pair = PairSpec(
        model=name,
        target=target,
        draft=draft,
        mmproj=mmproj,
        draft_key=draft_key,
        no_draft=no_draft,
        speculation=speculation.parse(spec) if spec else None,
    )
    extra_args = passthrough_args()
    check_plain(pair, ServerKnobs(**kv))  # as check_given: a conflict is said before "no engine found"
    check_given(pair)  # the user's input before the engine: a typo is said before "no engine found"
    if not print_only:  # a busy port is said before the load, not after it (minutes for a large model)
        require_free_port(host, port)
    eng = engine_mod.resolve_engine(llama_bin, rpc=bool(placement.rpc))
    with download_progress(disable=json_out) as on_progress:
        cfg, files = prepare_server(
            pair,
            ServerKnobs(
                **kv,
                ctx=ctx,
                threads=threads,
                ngl=ngl,
                extra_args=extra_args,
                parallel=parallel,
                host=host,
                port=port,
                api_key=api_key,
                category=category,
                placement=placement,
            ),
            Downloads(
                yes=yes,
                confirm=confirm_downloads,
                on_progress=on_progress,
                on_notice=lambda m: err.print(m, markup=False),
            ),
            engine=eng,
        )
    from dsparkcli.budget.choice import Want, category_budgets, chosen_server

    cfg, auto = chosen_server(
        eng,
        cfg,
        Want(budget=kv["auto_budget"], p_min=kv["auto_p_min"], adaptive=kv["adaptive_budget"], category=category),
    )
    if auto is not None:
        err.print(auto.message, markup=False)
    hazard = hazards.slot_hazard(eng, drafting=cfg.draft is not None, parallel=cfg.n_parallel)
    if hazard:
        err.print(f"dspark: warning: {hazard}", markup=False)
    per_category = category_budgets(auto)
    if per_category and engine_mod.capabilities(eng).request_draft_params:
        most = max(per_category.values())
        err.print(
            "per-request budgets by category (a request's speculative.n_max, or dspark run --server URL "
            f"--budget K): {', '.join(f'{c} {k}' for c, k in per_category.items())}"
            + (
                f"; this server drafts at most {cfg.n_max}: --budget {most} lets every category have its own"
                if isinstance(cfg.n_max, int) and most > cfg.n_max
                else ""
            ),
            markup=False,
        )
    if print_only:  # the line runs as printed: the key is passed as serve passes it, never shown
        shell = cfg.shell_line(eng.server, port, _key_word(api_key, api_key_file))
        if json_out:
            print_json({"argv": cfg.argv(eng.server, port), "env": sorted(cfg.env()), "shell": shell})
        else:
            out.print(shell, markup=False)
        return
    with Supervisor(eng, cfg, on_event=_say, max_restarts=max_restarts) as sup:
        srv = sup.server
        assert srv is not None
        info = {
            "url": srv.url,
            "pid": srv.pid,
            "log": str(srv.log_path),
            "target": str(files.target),
            "draft": str(cfg.draft) if cfg.draft else None,
            "mmproj": str(files.mmproj) if files.mmproj else None,
            "budget": cfg.n_max,
            "p_min": cfg.p_min,
            "parallel": cfg.n_parallel,
            "tuning": auto.message if auto else None,
            "category_budgets": per_category or None,
            "rpc": [str(e) for e in cfg.placement.rpc],
            "draft_device": cfg.placement.draft_device,
        }
        try:  # from the announcement on (a client may act on it at once), a signal is the normal end
            if json_out:
                print_json(info)
            else:
                out.print(
                    f"serving on {srv.url} (pid {srv.pid}, {cfg.n_parallel} at once, log {srv.log_path})", markup=False
                )
                if cfg.placement.rpc:
                    out.print(placement_describe(cfg.placement), markup=False)
                image = "IMAGE " if files.mmproj else ""  # a text-only pair takes no image
                out.print(f'ask it:  dspark run --server {srv.url} {image}"PROMPT"   (Ctrl-C stops)', markup=False)
            sup.watch()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cli/app.py) once serving: the normal end of serve
            pass
    # out of the `with`: llama-server has stopped. A signal before this point (loading) is an interruption
    err.print("dspark serve: stopped", markup=False)


def _key_word(api_key: str | None, key_file: Path | None) -> str:
    """The shell word a printed server line takes the API key from, never the key itself: the key file's
    first line, else $DSPARK_API_KEY (said on stderr when the key came from --api-key, not from there)."""
    if not api_key:
        return ""
    if key_file is not None:
        first = key_file.read_bytes().split(b"\n", 1)[0].decode("utf-8", "replace")
        if first != api_key:  # `head -n 1` keeps what dspark strips
            raise UsageError(
                f"--api-key-file {key_file}: its first line has blanks or a CR around the key, which "
                "dspark strips and a printed shell line would not: remove them"
            )
        return f'"$(head -n 1 {shlex.quote(os.path.abspath(key_file))})"'
    if os.environ.get(API_KEY_ENV) != api_key:
        err.print(
            f"dspark: note: the printed line reads the API key from {API_KEY_ENV}: set it there before running it",
            markup=False,
        )
    return f'"${API_KEY_ENV}"'


def _say(event: Event) -> None:
    """Supervision events on stderr, one line each (the dead server's last log lines indented under it)."""
    where = f" (log {event.log_path})" if event.log_path else ""
    err.print(f"dspark serve: {event.message}{where}", markup=False)
    for line in event.log_lines:
        err.print(f"  | {line}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve)
