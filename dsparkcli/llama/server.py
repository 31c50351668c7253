"""LlamaServer: the only owner of llama-server subprocesses (its HTTP client is ``llama.client``).

A server is started on a free loopback port, waited for through ``/health``, logged to a file of its own
and always stopped (SIGTERM, then SIGKILL after STOP_GRACE_S: it never exits while a stream is open), on
normal exit, on exceptions and, through PR_SET_PDEATHSIG, when the Python process itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsparkcli import config
from dsparkcli.errors import ServerError, UsageError
from dsparkcli.gguf.loadable import readable_load_checks, refuse_unloadable
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.flags import OWNED_FLAGS, check_extra_args, split_server_args  # noqa: F401 - re-exported
from dsparkcli.llama.loads import engine_label, engine_tables
from dsparkcli.llama.logs import abort_line, classify_log, key_line, log_tail  # noqa: F401 - log_tail: rpc, tests
from dsparkcli.llama.placement import Placement

DEFAULT_HOST = "127.0.0.1"
API_KEY_ENV = "LLAMA_API_KEY"
TYPE_STATS_VERBOSITY = 4  # common/log.h LOG_LEVEL_TRACE: the level of the per-type statistics line  # llama-server's environment name for --api-key (common/arg.cpp)


def api_key_value(key: str) -> str:
    """LLAMA_API_KEY's value that makes llama-server accept exactly ``key``: it reads the variable as one CSV
    row (common/arg.cpp parse_csv_row), so a key with a comma would become several shorter keys, and a
    leading double quote would be dropped. Such a key is quoted, its quotes doubled."""
    if "," in key or '"' in key:
        return '"' + key.replace('"', '""') + '"'
    return key


@dataclass(frozen=True)
class ServerConfig:
    """Everything that becomes llama-server's argv. ``None`` leaves llama.cpp's default."""

    model: Path
    draft: Path | None = None
    mmproj: Path | None = None
    spec_type: str | None = None  # defaults to draft-dspark when a draft is given; draft-simple, ngram-mod, ...
    spec_flags: tuple[tuple[str, int], ...] = ()  # the n-gram type's own flags (llama.speculation)
    # -lv 4: llama.cpp's per-type "statistics" line (common_speculative_print_stats, trace level) at each
    # request's end, the only place the pinned engine says which type of a chain proposed (llama.protocol)
    type_stats: bool = False
    n_max: int | str | None = None  # --spec-draft-n-max: a budget, or protocol.AUTO (needs cost_table)
    n_min: int | None = None  # --spec-draft-n-min
    p_min: float | None = None  # --spec-draft-p-min
    synth_len: float | None = None  # --spec-synth-len (synthetic acceptance: benchmarking only)
    synth_rates: tuple[float, ...] | None = None  # --spec-synth-rates: unconditional rate per position (n_max of them)
    cost_table: Path | None = None  # --spec-cost-table (dspark's patch): the adaptive budget's step costs
    ngl: str | int | None = None  # -ngl
    ngld: str | int | None = None  # -ngld
    flash_attn: str | None = None  # -fa on|off|auto
    ctx: int | None = None  # -c
    n_parallel: int = 1  # -np
    threads: int | None = None  # -t
    metrics: bool = True
    host: str = DEFAULT_HOST
    port: int = 0  # 0: pick a free one
    api_key: str | None = None  # passed through the environment, never argv or logs
    jinja: bool = False
    placement: Placement = Placement()  # --rpc workers, -sm/-ts/-mg, -dev/-devd
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_extra_args(self.extra_args)  # every caller (run, serve, bench, scripts) at once

    def without_draft(self) -> ServerConfig:
        """The same server with no draft and none of the draft's settings: plain decoding."""
        return replace(
            self,
            draft=None,
            spec_type=None,
            spec_flags=(),
            type_stats=False,
            n_max=None,
            n_min=None,
            p_min=None,
            synth_len=None,
            synth_rates=None,
            cost_table=None,
            ngld=None,
        )

    @property
    def speculates(self) -> bool:
        """Drafts of some kind: a draft model, or a speculation type without one (n-gram)."""
        return self.draft is not None or self.spec_type is not None

    def env(self) -> dict[str, str]:
        """What the child gets in its environment besides the parent's: the API key (argv is public in `ps`)."""
        return {API_KEY_ENV: api_key_value(self.api_key)} if self.api_key else {}

    def shell_line(self, server: Path, port: int, key_from: str = '"$DSPARK_API_KEY"') -> str:
        """The command as one pasteable shell line. The API key is not written out: ``key_from`` is a shell
        word that yields it (the caller knows where the key came from), assigned to LLAMA_API_KEY as
        ``env()`` does. A key that needs CSV quoting cannot be passed that way: UsageError."""
        line = shlex.join(self.argv(server, port))
        if not self.api_key:
            return line
        if api_key_value(self.api_key) != self.api_key:
            raise UsageError(
                f"the API key holds a comma or a double quote, which llama-server's {API_KEY_ENV} "
                "reads as a list of keys: a printed command line cannot pass it unchanged (dspark "
                "serve itself can); use a key without them"
            )
        return f"{API_KEY_ENV}={key_from} {line}"

    def argv(self, server: Path, port: int) -> list[str]:
        args = [
            str(server),
            "--host",
            self.host,
            "--port",
            str(port),
            "-m",
            str(self.model),
            "-np",
            str(self.n_parallel),
        ]
        if self.mmproj is not None:
            args += ["--mmproj", str(self.mmproj)]
        if self.draft is not None:
            args += ["-md", str(self.draft), "--spec-type", self.spec_type or "draft-dspark"]
        elif self.spec_type:
            args += ["--spec-type", self.spec_type]
        for flag, number in self.spec_flags:
            args += [flag, str(number)]
        if self.type_stats:
            args += ["-lv", str(TYPE_STATS_VERBOSITY)]
        for flag, value in (
            ("--spec-draft-n-max", self.n_max),
            ("--spec-draft-n-min", self.n_min),
            ("--spec-draft-p-min", self.p_min),
            ("--spec-synth-len", self.synth_len),
            ("--spec-synth-rates", ",".join(f"{r:.9g}" for r in self.synth_rates) if self.synth_rates else None),
            ("--spec-cost-table", self.cost_table),
            ("-ngl", self.ngl),
            ("-ngld", self.ngld),
            ("-fa", self.flash_attn),
            ("-c", self.ctx),
            ("-t", self.threads),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.metrics:
            args.append("--metrics")
        if self.jinja:
            args.append("--jinja")
        args += self.placement.argv(drafting=self.draft is not None)
        args += list(self.extra_args)
        return args


# ------------------------------------------------------------------ the process


KEEP_LOGS = 50
_LAUNCHES = itertools.count()  # per process: two launches on one port within a second get two logs
STOP_GRACE_S = 1.0  # SIGTERM to SIGKILL: idle, llama-server exits in ~0.05 s; with a stream open, never


def default_log_dir() -> Path:
    """Where every llama-server dspark starts writes its log (the newest KEEP_LOGS are kept): doctor says it."""
    return config.cache_dir() / "logs"


def prune_logs(log_dir: Path, keep: int = KEEP_LOGS, prefix: str = "llama-server") -> None:
    """Keep the newest ``keep`` logs named ``prefix-*.log`` in dspark's own log folder, so it does not grow
    forever."""
    try:
        logs = sorted(log_dir.glob(f"{prefix}-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in logs[keep:]:
        with contextlib.suppress(OSError):
            old.unlink()


def launch_stamp() -> str:
    """Unique per launch (time, pid, a counter): with the port, the name of a child's own log file, which
    is opened "x" (never an existing file): no process, however started, writes into another's log."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_LAUNCHES)}"


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def require_free_port(host: str, port: int) -> None:
    """ServerError (kind "port", as llama-server's own bind failure) when something listens on ``host:port``:
    said before a model is fetched or loaded, not after the load (minutes for a large one). Port 0 is always
    free. SO_REUSEADDR, as llama-server binds: a port in TIME_WAIT is free to it, so free here."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                return  # not ours to judge (an address this machine lacks): llama-server says it
            why = "in use" if e.errno == errno.EADDRINUSE else "not open to this user"
            raise ServerError(
                f"port {port} on {host} is {why}: give another --port (0 picks a free one)", kind="port"
            ) from None


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan even if dspark is SIGKILLed
    except OSError:
        pass
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches dspark, which stops us in order
    # a SIGINT ignored by whoever started dspark (a script's background job) would survive exec: the child
    # gets the default, as it would from a terminal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float) -> int | None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the exit code (None when there was no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return proc.returncode


@dataclass
class LlamaServer:
    """Context manager around one llama-server process.

    >>> with LlamaServer(engine, ServerConfig(model=Path("t.gguf"), draft=Path("d.gguf"), n_max=5)) as srv:
    ...     srv.client.completion({"prompt": "hi", "n_predict": 8})
    """

    engine: Engine
    config: ServerConfig
    startup_timeout: float = 300.0
    stop_grace: float = STOP_GRACE_S
    log_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    port: int = field(default=0, init=False)
    log_path: Path | None = field(default=None, init=False)
    client: ServerClient | None = field(default=None, init=False)  # type: ignore[assignment]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def argv(self) -> list[str]:
        return self.config.argv(self.engine.server, self.port)

    def _check_files(self) -> None:
        for label, path in (
            ("target", self.config.model),
            ("draft", self.config.draft),
            ("mmproj", self.config.mmproj),
        ):
            if path is not None and not Path(path).is_file():
                raise UsageError(f"{label} model not found: {path}")

    def _check_loads(self) -> None:
        """Refuse files the engine's tables say it cannot load; an unreadable header is left to llama.cpp."""
        tables = engine_tables(self.engine)
        if tables is not None:
            paths = [p for p in (self.config.model, self.config.draft, self.config.mmproj) if p is not None]
            refuse_unloadable(readable_load_checks(paths, tables), tables, engine_label(self.engine))

    def log_tail(self, n: int = 30) -> str:
        return log_tail(self.log_path, n)

    def start(self) -> LlamaServer:
        self._check_files()
        self._check_loads()
        if self.log_dir is None:  # kept after the run: the user's evidence when something failed
            self.log_dir = default_log_dir()
            prune_logs(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        explicit_port = self.config.port != 0
        for attempt in range(1 if explicit_port else 3):
            self.port = self.config.port or free_port(self.config.host)
            # one log per launch: a second server refused on a busy port must not truncate the first one's log
            self.log_path = self.log_dir / f"llama-server-{self.port}-{launch_stamp()}.log"
            env = {**os.environ, **self.env, **self.config.env()}
            with open(self.log_path, "xb") as log:  # never an existing file
                self.process = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    preexec_fn=die_with_parent,
                )
            self.client = ServerClient(self.url, api_key=self.config.api_key)
            try:
                self._wait_healthy()
                return self
            except ServerError as e:
                self.stop()
                if e.kind == "port" and not explicit_port and attempt < 2:
                    continue  # lost the race for a free port: take another
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _wait_healthy(self) -> None:
        assert self.process is not None and self.client is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self.process.poll()
            if rc is not None:
                raise self._died(rc, during="start")
            with contextlib.suppress(ServerError):
                if self.client.health() == 200:
                    return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"llama-server not healthy after {self.startup_timeout:.0f} s",
                    kind="timeout",
                    log_tail=self.log_tail(),
                    hint=f"log: {self.log_path}",
                )
            time.sleep(0.05)

    def _died(self, rc: int, *, during: str) -> ServerError:
        tail = self.log_tail(60)
        kind, summary = classify_log(tail)
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        if rc < 0:
            with contextlib.suppress(ValueError):
                how = f"signal {-rc}, {signal.Signals(-rc).name}"
            if kind == "error":
                abort = abort_line(tail)
                if abort is None:  # killed from outside (OOM killer, kill): its last line says nothing about why
                    return ServerError(
                        f"llama-server failed during {during} ({how}): killed by a signal",
                        kind="crash",
                        log_tail=tail,
                        hint=f"log: {self.log_path}",
                    )
                # it aborted itself (GGML_ABORT / GGML_ASSERT -> SIGABRT): the abort's own line is the cause
                return ServerError(
                    f"llama-server failed during {during} ({how}): {abort}",
                    kind="crash",
                    log_tail=tail,
                    hint=f"log: {self.log_path}",
                )
        return ServerError(
            f"llama-server failed during {during} ({how}): {summary}: {key_line(tail)}",
            kind=kind,
            log_tail=tail,
            hint=f"log: {self.log_path}",
        )

    def check_alive(self, during: str = "generation", wait: float = 0.0) -> None:
        """Raise a typed ServerError if the process has died (e.g. after a failed request). ``wait``: give
        a dying process that long to finish (an abort writes its backtrace before it exits, after the
        connection has already dropped)."""
        if self.process is not None:
            try:
                rc = self.process.wait(timeout=wait) if wait > 0 else self.process.poll()
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                raise self._died(rc, during=during)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace period. Returns the exit code. Idempotent."""
        if self.client is not None:
            self.client.close()
        return stop_process(self.process, self.stop_grace)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
