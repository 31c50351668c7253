"""`dspark doctor --selftest` on the real CPU engine: PASS in well under 30 s, and a real FAIL.

The FAIL case runs the same real llama-server through a wrapper that appends `--spec-draft-n-max 2`,
i.e. an engine that drafts differently from what it was asked: its counters cannot match.
"""

from __future__ import annotations

import json
import time

import pytest

from dsparkcli import selftest


@pytest.fixture(scope="module")
def wrong_budget_bin(tmp_path_factory, engine):
    d = tmp_path_factory.mktemp("wrapbin")
    wrapper = d / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{engine.server}" "$@" --spec-draft-n-max 2\n')
    wrapper.chmod(0o755)
    return d


@pytest.mark.timing  # a wall-clock bound
def test_selftest_passes_on_the_engine(engine):
    seen = []
    t0 = time.monotonic()
    result = selftest.run_selftest(engine=engine, on_check=seen.append)
    assert time.monotonic() - t0 < 30
    assert result.ok
    assert seen == list(result.checks)
    assert [c.name for c in result.checks] == [
        "completion prompt=1,2,3",
        "completion prompt=77",
        "chat with image",
        "/metrics after 3 requests",
        "completion prompt=1,2,3",
    ]
    for check in result.checks:
        assert check.ok and check.tokens_match and check.detail == ""
        assert check.observed_draft_n == check.expected_draft_n > 0
        assert check.observed_accepted == check.expected_accepted
        # 30 % wrong rows: the selftest exercises partial acceptance, not just the all-accepted path
        assert 0 < check.expected_accepted < check.expected_draft_n
    metrics = result.checks[3]
    assert metrics.expected_draft_n == sum(c.expected_draft_n for c in result.checks[:3])
    assert result.checks[4].p_min == 0.5 and result.checks[4].n_max == 3


def test_selftest_fails_when_the_engine_drafts_differently(engine, wrong_budget_bin):
    from dsparkcli.llama import engine as engine_mod

    wrapped = engine_mod.describe(engine_mod.resolve_engine(str(wrong_budget_bin)))
    result = selftest.run_selftest(engine=wrapped)
    assert not result.ok
    first = result.checks[0]
    # drafts of at most 2 tokens: fewer drafted tokens than predicted for n_max 8, same output text
    assert first.tokens_match
    assert first.observed_draft_n < first.expected_draft_n
    assert "draft_n" in first.detail
    assert "drafts_total" in result.checks[3].detail


@pytest.mark.engine  # starts llama-server through the CLI, without the engine fixture
def test_doctor_selftest_cli_pass(cli):
    proc = cli("doctor", "--selftest", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("PASS  ") for line in lines) == 5
    assert any(line.startswith("selftest PASS: 5 of 5 checks") for line in lines)
    assert "Traceback" not in proc.stderr


@pytest.mark.engine  # starts llama-server through the CLI, without the engine fixture
def test_doctor_selftest_cli_json(cli):
    t0 = time.monotonic()
    proc = cli("doctor", "--selftest", "--json", timeout=120)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["capabilities"]["draft_dspark"] is True
    st = doc["selftest"]
    assert st["ok"] is True and len(st["checks"]) == 5
    assert all(c["observed_draft_n"] == c["expected_draft_n"] for c in st["checks"])
    # its own time, within the command's: no fixed bound here (a loaded machine failed one); the 30 s bound
    # is test_selftest_passes_on_the_engine's, in the timing lane
    assert 0 < st["seconds"] < wall


def test_doctor_selftest_cli_fail_exits_nonzero(cli, wrong_budget_bin):
    proc = cli("doctor", "--selftest", "--llama-bin", str(wrong_budget_bin), timeout=120)
    assert proc.returncode == 3
    assert "selftest FAIL: 5 of 5 checks differ" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("dspark: error: DSpark selftest failed")
    assert "Traceback" not in proc.stderr


def test_doctor_help_shows_selftest_example(cli):
    proc = cli("doctor", "--help")
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout and "dspark doctor --selftest" in proc.stdout
