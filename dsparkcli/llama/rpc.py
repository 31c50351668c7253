"""RpcWorker: llama.cpp's ``ggml-rpc-server`` (tools/rpc) as a supervised child, with LlamaServer's guarantees.

A worker binds 127.0.0.1 unless told otherwise (RPC has no authentication: anyone who reaches the port
can run code-shaped graphs on the device and read its memory), is waited for until it listens on its
port, logs to a file, and is always stopped: SIGTERM, then SIGKILL, on exit, on exceptions and,
through PR_SET_PDEATHSIG, when the Python process itself is killed.

The worker serves one client at a time (``ggml_backend_rpc_start_server`` accepts in a loop and serves
each connection to its end), so one llama-server per set of workers; the next can connect once the
previous one has stopped.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsparkcli import config
from dsparkcli.errors import EngineCapabilityError, ServerError, UsageError
from dsparkcli.llama.engine import RPC_SERVER, Engine
from dsparkcli.llama.logs import classify_worker_log, log_tail
from dsparkcli.llama.placement import Endpoint, is_loopback
from dsparkcli.llama.server import DEFAULT_HOST, die_with_parent, free_port, launch_stamp, prune_logs, stop_process

RPC_HINT = "build one with: dspark engine build --rpc (add --backend cuda on a GPU machine)"


def worker_binary(engine: Engine) -> Path:
    """The engine's ggml-rpc-server; a one-line error naming the build that has it when missing."""
    path = engine.bin_dir / RPC_SERVER
    if not path.is_file():
        raise EngineCapabilityError(
            f"{RPC_SERVER} not found next to {engine.server}: this build has no RPC backend", hint=RPC_HINT
        )
    return path


@dataclass(frozen=True)
class WorkerConfig:
    host: str = DEFAULT_HOST
    port: int = 0  # 0: pick a free one
    devices: str | None = None  # -d: the worker's devices (default: its accelerators, else its CPU)
    threads: int | None = None  # -t: CPU device threads
    cache: bool = False  # -c: the worker's local tensor cache (~/.cache/llama.cpp/rpc)
    allow_remote: bool = False  # a non-loopback host must be asked for explicitly

    def validate(self) -> None:
        if not is_loopback(self.host) and not self.allow_remote:
            raise UsageError(
                f"--host {self.host} exposes the RPC worker beyond this machine and RPC has no "
                "authentication: add --allow-remote if this network is trusted"
            )
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be within 0..65535 (got {self.port})")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads must be >= 1 (got {self.threads})")

    def argv(self, binary: Path, port: int) -> list[str]:
        args = [str(binary), "--host", self.host, "--port", str(port)]
        if self.devices:
            args += ["--device", self.devices]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.cache:
            args.append("--cache")
        return args


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself has a listening TCP socket on ``port``. Asked through /proc, not by
    connecting: a connect would succeed on someone else's listener (a port already taken) and would
    take the worker's one client slot. The worker's stdout is block-buffered, so its banner cannot tell."""
    try:
        owned = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address "HEX_IP:HEX_PORT", state 0A = LISTEN, inode in column 10
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
                and f"socket:[{fields[9]}]" in owned
            ):
                return True
    return False


@dataclass
class RpcWorker:
    """Context manager around one rpc worker process.

    >>> with RpcWorker(engine, WorkerConfig()) as w:
    ...     LlamaServer(engine, replace(cfg, placement=Placement(rpc=(w.endpoint,))))
    """

    engine: Engine
    config: WorkerConfig = field(default_factory=WorkerConfig)
    startup_timeout: float = 60.0
    stop_grace: float = 5.0
    log_dir: Path | None = None

    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    port: int = field(default=0, init=False)
    log_path: Path | None = field(default=None, init=False)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.config.host, self.port)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def argv(self) -> list[str]:
        return self.config.argv(worker_binary(self.engine), self.port)

    def log_tail(self, n: int = 30) -> str:
        return log_tail(self.log_path, n)

    def start(self) -> RpcWorker:
        self.config.validate()
        binary = worker_binary(self.engine)
        if self.log_dir is None:
            self.log_dir = config.cache_dir() / "logs"
            prune_logs(self.log_dir, prefix="rpc-worker")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        explicit = self.config.port != 0
        for attempt in range(1 if explicit else 3):
            # free_port binds the wildcard of the worker's own host: a port free there is free to bind
            self.port = self.config.port or free_port(self.config.host if is_loopback(self.config.host) else "")
            # one log per launch: a second worker refused on a busy port must not truncate the first one's
            # log (whose death would then be blamed on "address already in use")
            self.log_path = self.log_dir / f"rpc-worker-{self.port}-{launch_stamp()}.log"
            with open(self.log_path, "xb") as log:  # never an existing file
                self.process = subprocess.Popen(
                    self.config.argv(binary, self.port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )
            try:
                self._wait_listening()
                return self
            except ServerError as e:
                self.stop()
                if e.kind == "port" and not explicit and attempt < 2:
                    continue
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _wait_listening(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self.process.poll()
            if rc is not None:
                raise self._died(rc, during="start")
            if _listens(self.process.pid, self.port):
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"rpc worker not listening on {self.endpoint} after {self.startup_timeout:.0f} s",
                    kind="timeout",
                    log_tail=self.log_tail(),
                    hint=f"log: {self.log_path}",
                )
            time.sleep(0.05)

    def _died(self, rc: int, *, during: str) -> ServerError:
        tail = self.log_tail(60)
        kind, summary, line = classify_worker_log(tail)
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        return ServerError(
            f"rpc worker {self.endpoint} failed during {during} ({how}): {summary}: {line}",
            kind=kind,
            log_tail=tail,
            hint=f"log: {self.log_path}",
        )

    def check_alive(self) -> None:
        if self.process is not None:
            rc = self.process.poll()
            if rc is not None:
                raise self._died(rc, during="serving")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace period. Returns the exit code. Idempotent."""
        return stop_process(self.process, self.stop_grace)

    def __enter__(self) -> RpcWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
