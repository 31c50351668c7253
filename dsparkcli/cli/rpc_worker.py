"""`dspark rpc-worker`: llama.cpp's RPC worker (ggml-rpc-server) on this machine's devices, until Ctrl-C."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import HostOpt, JsonOpt, LlamaBinOpt, PortOpt, ThreadsOpt
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.placement import is_loopback
from dsparkcli.llama.rpc import RpcWorker, WorkerConfig

HELP = """Lend this machine's devices to a llama-server elsewhere: run an RPC worker until Ctrl-C.

Another machine (or another process here) then places its target on it with
`dspark run|serve|bench --rpc HOST:PORT,...`. The worker binds 127.0.0.1 unless --host says
otherwise; RPC has NO authentication (whoever reaches the port can use the device and read its
memory), so a non-loopback host also needs --allow-remote, and only on a network you trust.
The worker serves one llama-server at a time. Needs an engine built with RPC (the default build).
Ctrl-C or SIGTERM stop it normally ("stopped", exit 0).

\b
Examples:
  dspark rpc-worker --port 50052                      # this machine's GPU(s), loopback only
  dspark rpc-worker --port 50052 --device CUDA1       # one GPU per worker
  dspark rpc-worker --host 10.0.0.2 --port 50052 --allow-remote   # trusted LAN only
  dspark run "Hi" --rpc 127.0.0.1:50052               # ... and use it
"""


def rpc_worker(
    host: HostOpt = "127.0.0.1",  # another address needs --allow-remote too
    port: PortOpt = 50052,
    device: Annotated[
        Optional[str],
        typer.Option("--device", "-d", help="Devices to lend, e.g. CUDA0 (default: all accelerators, else the CPU)."),
    ] = None,
    threads: ThreadsOpt = None,
    cache: Annotated[
        bool, typer.Option("--cache", help="Keep received tensors in a local file cache (faster reloads).")
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a non-loopback --host (RPC has no authentication).")
    ] = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    cfg = WorkerConfig(host=host, port=port, devices=device, threads=threads, cache=cache, allow_remote=allow_remote)
    cfg.validate()  # before the engine is looked up: a refused host is a usage error, whatever is installed
    if not is_loopback(host):
        err.print(
            f"warning: the RPC worker on {host} has no authentication: anyone who reaches port {port} "
            "can use this machine's devices and read their memory",
            markup=False,
        )
    eng = engine_mod.resolve_engine(llama_bin, rpc=True)
    with RpcWorker(eng, cfg) as worker:
        info = {"endpoint": str(worker.endpoint), "pid": worker.pid, "log": str(worker.log_path)}
        try:  # from the announcement on (a client may act on it at once), a signal is the normal end
            if json_out:
                print_json(info)
            else:
                out.print(f"rpc worker on {worker.endpoint} (pid {worker.pid}, log {worker.log_path})", markup=False)
                out.print(f'use it:  dspark run --rpc {worker.endpoint} "PROMPT"   (Ctrl-C stops)', markup=False)
            while True:  # until Ctrl-C / SIGTERM (which stop the worker too) or the worker's death (one line)
                worker.check_alive()
                time.sleep(0.5)
        except KeyboardInterrupt:  # the normal end of a worker, as of `dspark serve`: exit 0
            pass
    err.print("dspark rpc-worker: stopped", markup=False)


def register(app: typer.Typer) -> None:
    app.command("rpc-worker", help=HELP)(rpc_worker)
