"""`dspark run --compare`: the drafted answer against plain decoding, with the real llama-server.

The synthetic vision pair's greedy answer is known exactly (its target's tokens do not depend on the
draft), so the comparison must say "identical"; where they part is checked on llama-server's own
log-probability entries (the format plain's request returns), byte by byte.
"""

from __future__ import annotations

import json

import pytest

from dsparkcli.plaincheck import NEAR_TIE, Divergence, PlainComparison, first_divergence
from dsparkcli.synth import known_answer as synth


@pytest.fixture(scope="module")
def vpair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("cmp"), vocab=128, accept_rate=0.7, vision=True, seed=11)


def _tok(text: str, top: list[tuple[str, float]] | None = None) -> dict:
    b = list(text.encode())
    return {
        "token": text,
        "bytes": b,
        "logprob": (top or [(text, -0.1)])[0][1],
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in (top or [(text, -0.1), ("x", -3.0)])],
    }


def test_first_divergence_is_found_byte_by_byte() -> None:
    plain = [_tok("def"), _tok(" rev"), _tok("é", [("é", -0.70), ("e", -0.80)]), _tok("(s)")]
    assert first_divergence("def revé(s)", plain) is None
    d = first_divergence("def reve(s)", plain)
    assert d == Divergence(2, "é", "e(s)", (("é", -0.70), ("e", -0.80)))
    assert d.margin == pytest.approx(0.10) and d.near_tie and d.margin < NEAR_TIE
    clear = first_divergence("def revX", [_tok("def"), _tok(" rev"), _tok("é", [("é", -0.05), ("X", -4.0)])])
    assert clear is not None and not clear.near_tie and clear.margin == pytest.approx(3.95)
    ended = first_divergence("def rev more", [_tok("def"), _tok(" rev")])  # plain stopped first
    assert ended == Divergence(2, "", " more", ())
    msg = PlainComparison(False, 4, 80.0, d).message()
    assert msg.startswith("differs from plain decoding from token 2: plain 'é', drafted 'e(s)'") and "near-tie" in msg
    assert "NOT a near-tie" in PlainComparison(False, 3, 80.0, clear).message()
    assert PlainComparison(True, 4, 80.0, None).message() == "identical to plain decoding (4 tokens, plain 80.0 tok/s)"
    blind = PlainComparison(False, 0, 80.0, Divergence(-1, "abc", "abd", ())).message()
    assert blind == "differs from plain decoding (the server gave no per-token detail): plain 'abc', drafted 'abd'"


@pytest.mark.engine  # starts llama-server through the CLI, without the engine fixture
def test_run_compare_says_identical_for_the_known_answer_pair(cli, vpair) -> None:
    args = [
        "run",
        str(vpair.image),
        "What is in this image?",
        "--target",
        str(vpair.target),
        "--draft",
        str(vpair.draft),
        "--mmproj",
        str(vpair.mmproj),
        "--max-tokens",
        "24",
        "-t",
        "2",
        "--ctx",
        "1024",
        "--budget",
        "3",
        "--compare",
    ]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == f"identical to plain decoding (24 tokens, plain {lines[-1].split('plain ')[-1]}"
    assert "| drafted " in lines[-2]  # the drafted run's own statistics come first
    assert proc.stdout.endswith("\n") and not proc.stdout.endswith("\n\n")
    rec = json.loads(cli(*args, "--json").stdout)
    assert rec["comparison"]["identical"] is True and rec["comparison"]["plain_tokens"] == 24
    assert rec["comparison"]["divergence"] is None and rec["drafted"] > 0


def test_compare_refuses_what_it_cannot_compare(cli, vpair) -> None:
    base = ["run", "hi", "--target", str(vpair.target), "--draft", str(vpair.draft), "--compare"]
    for extra, says in ((["--temp", "0.7"], "--compare needs greedy decoding"), (["--no-draft"], "drop --no-draft")):
        proc = cli(*base, *extra)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1
    proc = cli("run", "hi", "--server", "http://127.0.0.1:9", "--compare")
    assert proc.returncode == 2 and "drop --server" in proc.stderr
