"""`dspark serve [NAME]`: keep one llama-server with the DSpark draft up, OpenAI-compatible, supervised."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Optional

import typer

from dsparkcli.bench import tuned
from dsparkcli.cli._common import (
    ApiKeyFileOpt,
    ApiKeyOpt,
    BudgetOpt,
    CtxOpt,
    DraftKeyOpt,
    DraftOpt,
    JsonOpt,
    LlamaBinOpt,
    MmprojOpt,
    NglOpt,
    AutoPMinOpt,
    CategoryOpt,
    NoDraftOpt,
    TargetOpt,
    ThreadsOpt,
    YesOpt,
    api_key_from,
    knob_values,
    passthrough_args,
)
from dsparkcli.cli._download import confirm_downloads, download_progress
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.errors import UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.supervise import DEFAULT_MAX_RESTARTS, Event, Supervisor
from dsparkcli.pairs import Downloads, PairSpec, ServerKnobs, prepare_server

HELP = """Serve a target + DSpark draft (+ vision projector) until Ctrl-C or SIGTERM.

OpenAI-compatible (/v1/chat/completions). Binds 127.0.0.1 unless --host says otherwise; a
non-loopback host requires an API key: DSPARK_API_KEY or --api-key-file (--api-key works but shows
the key to every user in `ps`). Ask it with `dspark run --server URL` so a large model is
loaded once. --parallel N decodes N requests at once (llama-server -np N; --ctx is per request).
If llama-server dies, serve says why (its last log lines), restarts it on the same port with
backoff (0.5, 1, 2, 4, 8 s) and says when it is healthy again; --max-restarts failures in a row
end it (exit 4). Ctrl-C/SIGTERM stop llama-server too.

\b
Examples:
  dspark serve minicpm-v-4.7 --port 8080
  dspark serve minicpm-v-4.7 --parallel 4 --ctx 4096     # four users at once, 4096 tokens each
  dspark serve --target t.gguf --draft d.gguf --mmproj mm.gguf --budget 5
  dspark serve minicpm-v-4.7 --budget auto --p-min auto   # what `dspark tune` chose on this machine
  DSPARK_API_KEY="$KEY" dspark serve minicpm-v-4.7 --host 0.0.0.0 -- -ngl 99 -fa on
  dspark serve minicpm-v-4.7 --host 0.0.0.0 --api-key-file ~/.config/dspark/key
"""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    name: Annotated[Optional[str], typer.Argument(help="Pair name from models.toml.")] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    mmproj: MmprojOpt = None,
    draft_key: DraftKeyOpt = None,
    budget: BudgetOpt = None,
    no_draft: NoDraftOpt = False,
    p_min: AutoPMinOpt = None,
    category: CategoryOpt = None,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    ngl: NglOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="Port (0 = any free one).")] = 8080,
    parallel: Annotated[int, typer.Option("--parallel", "-np", min=1, help="Requests decoded at once (-np).")] = 1,
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0, help="Restarts in a row before giving up.")] = DEFAULT_MAX_RESTARTS,
    api_key: ApiKeyOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    yes: YesOpt = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    api_key = api_key_from(api_key, api_key_file)
    if not _is_loopback(host) and not api_key:
        raise UsageError(f"--host {host} exposes the server beyond this machine: set DSPARK_API_KEY or give --api-key-file")
    eng = engine_mod.resolve_engine(llama_bin)
    kv = knob_values(budget, p_min)
    with download_progress(disable=json_out) as on_progress:
        cfg, files = prepare_server(
            PairSpec(model=name, target=target, draft=draft, mmproj=mmproj, draft_key=draft_key, no_draft=no_draft),
            ServerKnobs(**kv, ctx=ctx, threads=threads, ngl=ngl, extra_args=passthrough_args(),
                        parallel=parallel, host=host, port=port, api_key=api_key, category=category),
            Downloads(yes=yes, confirm=confirm_downloads, on_progress=on_progress))
    cfg, auto = tuned.apply_auto(eng, cfg, budget=kv["auto_budget"], p_min=kv["auto_p_min"],
                                 category=category)
    if auto is not None:
        err.print(auto.message, markup=False)
    with Supervisor(eng, cfg, on_event=_say, max_restarts=max_restarts) as sup:
        srv = sup.server
        assert srv is not None
        info = {"url": srv.url, "pid": srv.pid, "log": str(srv.log_path), "target": str(files.target),
                "draft": str(files.draft) if files.draft else None, "mmproj": str(files.mmproj) if files.mmproj else None,
                "budget": cfg.n_max, "p_min": cfg.p_min, "parallel": cfg.n_parallel,
                "tuning": auto.message if auto else None}
        if json_out:
            print_json(info)
        else:
            out.print(f"serving on {srv.url} (pid {srv.pid}, {cfg.n_parallel} at once, log {srv.log_path})", markup=False)
            out.print(f"ask it:  dspark run --server {srv.url} IMAGE \"PROMPT\"   (Ctrl-C stops)", markup=False)
        sup.watch()


def _say(event: Event) -> None:
    """Supervision events on stderr, one line each (the dead server's last log lines indented under it)."""
    where = f" (log {event.log_path})" if event.log_path else ""
    err.print(f"dspark serve: {event.message}{where}", markup=False)
    for line in event.log_lines:
        err.print(f"  | {line}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve)
