"""Keep one llama-server alive for `dspark serve`: restart it when it dies, with bounded backoff.

The first start is not retried: a wrong file or a taken port fails the same way every time, so it
fails at once, in one line. After that, a death (a crash, the OOM killer, someone's ``kill -9``) is
reported with its cause from the server's last log lines, the dead server's log is kept under a
``-died-N`` name (the final error names it there too), and a new server is started on the SAME port (clients reconnect to the URL they
know) and waited for through ``/health``. Restarts wait ``backoff`` seconds (0.5, 1, 2, 4, 8 ...) and
are bounded: ``max_restarts`` deaths or failed restarts in a row end serving with the last cause;
a server that stayed up ``stable_s`` seconds clears the count.

No proxy stands in front of llama-server (docs/DESIGN.md): clients talk to it directly, so
streaming is untouched and costs nothing; the price is that requests in flight when it dies fail
and a client retries them while it restarts.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsparkcli.errors import DsparkError, ServerError
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import LlamaServer, ServerConfig

DEFAULT_MAX_RESTARTS = 5
DEFAULT_STABLE_S = 60.0
LOG_LINES = 5  # of a dead server's log, in the event that reports its death


@dataclass(frozen=True)
class Event:
    """What the supervisor did, for the CLI to say.

    ``kind``: ``died`` (cause, log lines), ``restarting`` (delay, attempt), ``restart-failed`` (cause),
    ``ready`` (after a restart: new pid). Giving up is no event: ``watch`` raises it.
    """

    kind: str
    message: str
    pid: int | None = None
    attempt: int = 0
    delay_s: float = 0.0
    log_lines: tuple[str, ...] = ()
    log_path: Path | None = None


def backoff_delay(attempt: int, base: float = 0.5, cap: float = 8.0) -> float:
    """Seconds before restart ``attempt`` (1-based): base, 2 base, 4 base ... up to ``cap``."""
    return min(cap, base * 2 ** (attempt - 1))


@dataclass
class Supervisor:
    """Context manager: ``with Supervisor(engine, cfg, on_event=print) as sup: sup.watch()``."""

    engine: Engine
    config: ServerConfig
    on_event: Callable[[Event], None] = lambda e: None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff_base: float = 0.5
    backoff_cap: float = 8.0
    stable_s: float = DEFAULT_STABLE_S
    poll_s: float = 0.2
    env: dict[str, str] = field(default_factory=dict)
    server: LlamaServer | None = field(default=None, init=False)
    restarts: int = field(default=0, init=False)  # restarts done since the start (for the record)
    _deaths: int = field(default=0, init=False)  # deaths and failed restarts in a row
    _up_since: float = field(default=0.0, init=False)

    def start(self) -> LlamaServer:
        self.server = LlamaServer(self.engine, self.config, env=dict(self.env)).start()
        # a restart must come back where clients look for it, even when the first port was picked freely
        self.config = replace(self.config, port=self.server.port)
        self._up_since = time.monotonic()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def watch(self, until: Callable[[], bool] = lambda: False) -> None:
        """Poll the server until ``until()`` is true (forever by default; Ctrl-C/SIGTERM end it);
        restart it whenever it dies. Raises ServerError when ``max_restarts`` attempts in a row failed."""
        while not until():
            self.check()
            time.sleep(self.poll_s)

    def check(self) -> None:
        """One poll: nothing while the server lives; a death is reported and repaired before returning."""
        srv = self.server
        assert srv is not None, "start() first"
        try:
            srv.check_alive(during="serving")
            return
        except ServerError as e:
            cause = e
        if time.monotonic() - self._up_since >= self.stable_s:
            self._deaths = 0  # it served a good while: this is a new failure, not the same one again
        kept = self._keep_log(srv)
        if kept is not None and kept != srv.log_path:  # the cause names the log where it is now, also when
            cause = ServerError(
                cause.message,
                hint=f"log: {kept}",  # serve gives up on it
                log_tail=cause.log_tail,
                kind=cause.kind,
            )
        self.on_event(Event("died", cause.message, pid=srv.pid, log_lines=_last_lines(cause.log_tail), log_path=kept))
        self._restart(cause)

    def _keep_log(self, srv: LlamaServer) -> Path | None:
        """Rename the dead server's log ``...-died-N.log`` (every launch has a log of its own: the name
        only marks the dead ones), never over an existing file; the path it has now."""
        if srv.log_path is None or not srv.log_path.is_file():
            return srv.log_path
        kept = srv.log_path.with_name(f"{srv.log_path.stem}-died-{self.restarts + 1}.log")
        try:
            os.link(srv.log_path, kept)  # unlike rename, fails when `kept` exists
        except OSError:
            return srv.log_path
        with contextlib.suppress(OSError):
            srv.log_path.unlink()
        return kept

    def _restart(self, cause: DsparkError) -> None:
        while True:
            self._deaths += 1
            if self._deaths > self.max_restarts:
                message = (
                    f"llama-server failed {self._deaths} times in a row; gave up after "
                    f"{self.max_restarts} restarts: {cause.message}"
                )
                raise ServerError(
                    message,
                    kind=getattr(cause, "kind", "error"),
                    log_tail=getattr(cause, "log_tail", ""),
                    hint=cause.hint,
                )
            delay = backoff_delay(self._deaths, self.backoff_base, self.backoff_cap)
            self.on_event(
                Event(
                    "restarting",
                    f"restarting llama-server in {delay:g} s (attempt {self._deaths} of {self.max_restarts})",
                    attempt=self._deaths,
                    delay_s=delay,
                )
            )
            time.sleep(delay)
            try:
                self.start()
            except DsparkError as e:  # the port taken meanwhile, a file gone, out of memory ...
                cause = e
                self.on_event(
                    Event(
                        "restart-failed",
                        f"restart {self._deaths} failed: {e.message}",
                        attempt=self._deaths,
                        log_lines=_last_lines(getattr(e, "log_tail", "")),
                    )
                )
                continue
            self.restarts += 1
            assert self.server is not None
            self.on_event(
                Event(
                    "ready",
                    f"llama-server restarted (pid {self.server.pid}) and healthy on {self.server.url}",
                    pid=self.server.pid,
                    attempt=self._deaths,
                )
            )
            return


def _last_lines(text: str, n: int = LOG_LINES) -> tuple[str, ...]:
    return tuple(ln for ln in text.splitlines() if ln.strip())[-n:]
