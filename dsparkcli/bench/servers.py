"""Which llama-server a bench configuration runs on: its own, or one already loaded that can serve it.

A server load is most of what a short measurement costs on a large target (the 20 GB stand-in takes
~6 s to load and ~1 s to decode 256 tokens), and tune measures several configurations of one pair.
With dspark's patch series llama-server honours a request's own ``speculative.n_max``, so one server
started at budget K drafts exactly like a server started at any k <= K, provided everything else in its
argv is the same, including the synthetic acceptance it emulates. llama.cpp turns ``--spec-synth-len``
and ``--spec-synth-rates`` into one conditional probability per draft position that does not depend on
the budget (common/speculative.cpp, ``synth_probs``), so budget k on the K server emulates the first k
rates of K's. That holds for rates that are a prefix of the host's, which is what tune's ``rates`` mode
measures, and for real acceptance. The CPU tests assert the drafted/accepted counters of a shared
server equal those of a server of its own, exactly.

``ServerPool`` keeps at most one plain and one draft server loaded (two targets in memory at most),
and hands out a loaded server when it can serve the next configuration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from dsparkcli.budget.model import synth_rates
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.protocol import SPEC_N_MAX
from dsparkcli.llama.server import LlamaServer, ServerConfig

_RATE_TOL = 1e-9


def effective_rates(cfg: ServerConfig) -> tuple[float, ...] | None:
    """The unconditional acceptance rate per draft position cfg's server emulates (None: real acceptance)."""
    if cfg.synth_rates is not None:
        return tuple(cfg.synth_rates)
    if cfg.synth_len is not None and isinstance(cfg.n_max, int):
        return synth_rates(cfg.synth_len, cfg.n_max)
    return None


def can_serve(host: ServerConfig, want: ServerConfig) -> bool:
    """Whether host's server gives want's drafts when each request asks ``speculative.n_max = want.n_max``."""
    if host == want:
        return True
    if host.draft is None or want.draft is None or host.cost_table is not None or want.cost_table is not None:
        return False
    if not (isinstance(host.n_max, int) and isinstance(want.n_max, int)) or want.n_max > host.n_max:
        return False
    if replace(want, n_max=host.n_max, synth_len=host.synth_len, synth_rates=host.synth_rates) != host:
        return False
    mine, theirs = effective_rates(want), effective_rates(host)
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return len(mine) <= len(theirs) and all(abs(a - b) <= _RATE_TOL for a, b in zip(mine, theirs))


def request_fields(host: ServerConfig, want: ServerConfig) -> dict[str, Any]:
    """The request's own draft settings that make host's server run want's configuration."""
    return {} if host.n_max == want.n_max else {SPEC_N_MAX: want.n_max}


@dataclass
class Loaded:
    server: LlamaServer
    load_s: float  # its start, paid by the first configuration that used it
    uses: int = 0


@dataclass
class ServerPool:
    """Loaded servers for the configurations to come: one plain and one draft server at most.

    ``share``: serve a configuration from a loaded server that ``can_serve`` it (only with an engine that
    honours per-request draft settings); otherwise only an identical configuration reuses a server."""

    engine: Engine
    share: bool = False
    env: dict[str, str] = field(default_factory=dict)
    _slots: dict[bool, Loaded] = field(default_factory=dict)  # drafting? -> the loaded server

    def acquire(self, want: ServerConfig, plan_host: ServerConfig | None = None) -> tuple[Loaded, dict[str, Any]]:
        """A server for ``want`` (a loaded one, else ``plan_host`` or ``want`` started now) and the
        request fields it needs."""
        slot = want.speculates  # a drafting server (a draft model or n-gram), or a plain one
        held = self._slots.get(slot)
        if held is not None and (held.server.config == want or (self.share and can_serve(held.server.config, want))):
            held.uses += 1
            return held, request_fields(held.server.config, want)
        if held is not None:
            self._release(slot)
        host = plan_host if self.share and plan_host is not None and can_serve(plan_host, want) else want
        srv = LlamaServer(self.engine, host, env=dict(self.env))
        t0 = time.perf_counter()
        srv.start()
        loaded = Loaded(srv, time.perf_counter() - t0, uses=1)
        self._slots[slot] = loaded
        return loaded, request_fields(host, want)

    def _release(self, slot: bool) -> None:
        held = self._slots.pop(slot, None)
        if held is not None:
            held.server.stop()

    def close(self) -> None:
        for slot in list(self._slots):
            self._release(slot)

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plan_hosts(configs: list[ServerConfig]) -> list[ServerConfig]:
    """For each configuration, the one of ``configs`` with the largest budget that can serve it (itself
    when none can): a plan's budgets then share the server of its largest."""
    hosts = []
    for want in configs:
        able = [c for c in configs if can_serve(c, want)]
        hosts.append(max(able, key=lambda c: c.n_max if isinstance(c.n_max, int) else -1))
    return hosts
