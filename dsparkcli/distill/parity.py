"""Does llama.cpp draft what the training code's draft proposes? (SpecForge shipped drafts that did not.)

``simulate`` replays llama-server's speculative loop for one greedy request with the torch draft: the
target's output tokens are known (greedy decoding gives the same tokens with or without a draft), so
each draft call's anchor, context and accepted count follow. ``logged_proposals`` reads what the
engine really proposed from its ``-v`` log (``draft candidate 0`` lines). ``agreement`` compares them
call by call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsparkcli.distill.model import DSparkDraft
from dsparkcli.distill.target import Target

_CAND = re.compile(r"seq_id\s+(\d+), draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")


@dataclass(frozen=True)
class Simulation:
    proposals: list[list[int]]  # one list per draft call, before truncation (what the log shows)
    truths: list[list[int]]  # per call: the target's tokens its (truncated) draft is checked against
    drafted: int  # after truncation to the request's remaining budget (timings.draft_n)
    accepted: int  # timings.draft_n_accepted
    steps: int  # verification steps


def logged_proposals(log: str, seq_id: int = 0) -> list[list[int]]:
    calls: list[list[int]] = []
    for m in _CAND.finditer(log):
        if int(m.group(1)) != seq_id:
            continue
        pos, tok = int(m.group(2)), int(m.group(3))
        if pos == 0 or not calls:
            calls.append([])
        calls[-1].append(tok)
    return calls


@torch.no_grad()
def simulate(
    target: Target, draft: DSparkDraft, prompt: Sequence[int], output: Sequence[int], budget: int, n_predict: int
) -> Simulation:
    """llama-server's loop (server-context.cpp): a draft of min(budget, n_remaining - 1) tokens after
    each sampled token, accepted while it equals the target's greedy token, plus one target token."""
    seq = list(prompt) + list(output)
    dev = target.device
    tokens = torch.tensor([seq], device=dev)
    _, feats = target(tokens, draft.cfg.taps, logits=False)
    feats = feats.to(next(draft.parameters()).dtype)
    n0 = len(prompt)
    # every output token may become an anchor; which ones do depends on the proposals
    anchors = [n0 + c for c in range(len(output)) if min(budget, n_predict - (c + 1) - 1) > 0]
    if not anchors:
        return Simulation([], [], 0, 0, 0)
    # proposals depend only on (context < anchor, anchor): compute them for every candidate anchor at once
    anc = torch.tensor([anchors], device=dev)
    props, _ = draft.propose(tokens, feats, anc, budget, target.tok_embd.to(feats.dtype), target.head)
    by_anchor = {a: p for a, p in zip(anchors, props[0].tolist())}
    proposals, truths, drafted, accepted, steps = [], [], 0, 0, 0
    c = 0
    while c < len(output):
        n_max = min(budget, n_predict - (c + 1) - 1)
        if n_max <= 0:
            break
        p = by_anchor[n0 + c]
        proposals.append(p)
        truths.append(list(output[c + 1 : c + 1 + n_max]))
        d = p[:n_max]
        j = 0
        while j < len(d) and c + 1 + j < len(output) and d[j] == output[c + 1 + j]:
            j += 1
        drafted += len(d)
        accepted += j
        steps += 1
        c += j + 1
    return Simulation(proposals, truths, drafted, accepted, steps)


def decisive_agreement(sim: Simulation, logged: list[list[int]]) -> tuple[int, int]:
    """(decisive positions where the engine agrees with the simulation, decisive positions).

    The decisive positions of a draft call are the ones that set its accepted count: every slot the
    simulated draft gets right (the engine must propose the same token) and the first slot it gets wrong
    (the engine must get it wrong too). After that slot the greedy chains continue from different tokens,
    so near-ties there say nothing about the graph; `agreement` counts those too.
    """
    same = total = 0
    for i, (p, t) in enumerate(zip(sim.proposals, sim.truths)):
        e = logged[i] if i < len(logged) else []
        j = 0
        while j < len(t) and p[j] == t[j]:
            j += 1
        for k in range(j):
            total += 1
            same += int(k < len(e) and e[k] == p[k])
        if j < len(t):
            total += 1
            same += int(j < len(e) and e[j] != t[j])
    return same, total


def agreement(sim: Simulation, logged: list[list[int]]) -> tuple[int, int]:
    """(positions where the engine's proposal equals the simulation's, positions compared)."""
    same = total = 0
    for a, b in zip(sim.proposals, logged):
        for x, y in zip(a, b):
            total += 1
            same += int(x == y)
    total += abs(len(sim.proposals) - len(logged)) * (len(sim.proposals[0]) if sim.proposals else 0)
    return same, total
