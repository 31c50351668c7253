"""The study kit's lease tool (study/lease.py, issue 39): its plan, its packing into calls of at most 64 MiB,
the device side's receive/join, poll's deadline and resume, and the whole queue end to end on the CPU engine
(the dry run every lease is rehearsed with)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from study import lease, lease_render

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO / "tests/data/lease"


@pytest.fixture
def device(tmp_path, monkeypatch):
    """A lease dir of its own, as the GPU machine's /tmp/dspark-lease."""
    d = tmp_path / "device"
    monkeypatch.setattr(lease, "DEVICE_DIR", d)
    monkeypatch.setenv("DSPARK_LEASE_DRY", "1")
    return d


def test_the_plan_is_ranked_and_every_leg_names_its_needs_and_time():
    plan_id, legs = lease.load_plan()
    assert plan_id == "issue-39"
    assert [leg.rank for leg in legs] == sorted(leg.rank for leg in legs)
    assert legs[0].name == "baseline-real"  # the first measuring leg: the b11549 baseline
    for leg in legs:
        assert leg.expected_s > 0 and leg.needs and "$LEG_OUT" in leg.command
        assert set(leg.needs) <= {"engine", "real", "standin", "eval"}
    # every leg fits one device call (10 minutes) with room for the poll's own start
    assert max(leg.expected_s for leg in legs) <= 540


def test_pack_splits_items_into_calls_within_the_budget_and_recv_joins_them(tmp_path, device):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(700_000))
    b.write_bytes(os.urandom(2_500_000))
    items = [lease.Item("a.bin", "sdist", a), lease.Item("b.bin", "target", b)]
    out = tmp_path / "repo" / ".lease"
    m = lease.split_into_calls(items, 1_000_000, out)
    assert [c["bytes"] <= 1_000_000 for c in m["calls"]] == [True] * len(m["calls"])
    assert sum(c["bytes"] for c in m["calls"]) == 3_200_000
    assert len(m["calls"]) == 4  # 3.2 MB in calls of at most 1 MB
    assert m["items"][0]["parts"][0]["call"] == 1  # the sdist first: call 1 starts the build
    # the calls arrive one at a time; an item is joined only when all its parts are there
    calls = sorted(out.glob("call*"))
    hidden = tmp_path / "later"
    hidden.mkdir()
    for c in calls[1:]:
        c.rename(hidden / c.name)
    got = lease.recv(tmp_path / "repo")
    assert got["joined"] == ["a.bin"] and got["missing"] == ["b.bin"]
    calls[0].rename(hidden / "done1")
    for c in sorted(hidden.glob("call*")):
        c.rename(out / c.name)
    got = lease.recv(tmp_path / "repo")
    assert got["joined"] == ["b.bin"]
    assert (device / "files" / "b.bin").read_bytes() == b.read_bytes()


def test_recv_refuses_parts_whose_join_does_not_match_the_manifest(tmp_path, device):
    a = tmp_path / "a.bin"
    a.write_bytes(os.urandom(300_000))
    out = tmp_path / "repo" / ".lease"
    lease.split_into_calls([lease.Item("a.bin", "target", a)], 200_000, out)
    part = next((out / "call2").glob("a.bin.part*"))
    part.write_bytes(b"x" * part.stat().st_size)  # a part corrupted on the way
    with pytest.raises(SystemExit, match="sha256"):
        lease.recv(tmp_path / "repo")
    assert not (device / "files" / "a.bin").exists()


def test_a_lean_tree_leaves_the_results_out_of_what_travels():
    full, lean = lease.travel_bytes(lean=False), lease.travel_bytes(lean=True)
    results = sum(p.stat().st_size for p in (REPO / "study/results").rglob("*") if p.is_file())
    assert full - lean > 0.9 * results  # untracked results files are not sent either way
    # what a call can carry besides the tree: room for the 94 MiB REAL target in a few calls
    assert lease.CALL_LIMIT - lease.MARGIN - lean > 30 << 20


def _tiny_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        'plan = "tiny"\n'
        '[[legs]]\nname = "first"\nrank = 1\nexpected_s = 1\nneeds = ["eval"]\n'
        'command = "echo one > $LEG_OUT/one.txt"\n'
        '[[legs]]\nname = "slow"\nrank = 2\nexpected_s = 1\nneeds = ["eval"]\n'
        'command = "if [ ! -f $LEG_OUT/../../slow-ok ]; then sleep 30; fi; echo two > $LEG_OUT/two.txt"\n'
        '[[legs]]\nname = "broken"\nrank = 3\nexpected_s = 1\nneeds = ["eval"]\ncommand = "exit 7"\n'
    )
    return plan


def test_poll_stops_at_its_deadline_and_the_next_poll_resumes_at_the_leg_in_flight(tmp_path, device):
    (device / "files").mkdir(parents=True)
    (device / "files" / "spec_bench.jsonl").write_text("{}\n")
    plan, out = _tiny_plan(tmp_path), tmp_path / "out"
    assert lease.poll(4, out, tmp_path, plan=plan) == 1  # 'slow' was killed at the deadline
    first = json.loads((device / "poll.json").read_text())["legs"]
    assert [(leg["name"], leg["rc"]) for leg in first] == [("first", 0), ("slow", -1)]
    (device / "slow-ok").write_text("")
    assert lease.poll(60, out, tmp_path, plan=plan) == 1  # 'broken' fails
    second = json.loads((device / "poll.json").read_text())["legs"]
    assert [(leg["name"], leg["rc"]) for leg in second] == [("slow", 0), ("broken", 7)]
    assert lease.poll(60, out, tmp_path, plan=plan) == 0  # nothing left: a failed leg is not retried
    assert json.loads((device / "poll.json").read_text())["legs"] == []
    with tarfile.open(out / "lease-2.tar.gz") as tf:
        names = tf.getnames()
    assert "legs/slow/two.txt" in names and "lease.jsonl" in names and "legs/first/one.txt" not in names


def test_import_writes_a_lease_log_that_plan_reads_as_done(tmp_path, device, monkeypatch):
    (device / "files").mkdir(parents=True)
    (device / "files" / "spec_bench.jsonl").write_text("{}\n")
    (device / "slow-ok").write_text("")
    monkeypatch.setattr(lease, "LEASE", tmp_path / "lease")
    (tmp_path / "lease").mkdir()
    (tmp_path / "lease" / "begin.json").write_text(json.dumps({"t": lease._now() - 5}))
    plan, out = _tiny_plan(tmp_path), tmp_path / "out"
    lease.poll(60, out, tmp_path, plan=plan)
    results = tmp_path / "results"
    dest = lease.import_archives(sorted(out.glob("lease-*.tar.gz")), held_s=100, results=results)
    log = json.loads((dest / "lease-log.json").read_text())
    assert log["plan"] == "tiny" and [leg["rc"] for leg in log["legs"]] == [0, 0, 7]
    assert 5 <= log["lease"]["first_measuring_leg_s"] < 60 and log["lease"]["held_s"] == 100
    assert (dest / "first" / "one.txt").read_text() == "one\n"
    _, legs = lease.load_plan(plan)
    assert [leg.name for leg in lease.owed("tiny", legs, results)] == ["broken"]


def test_the_spec_bench_cut_keeps_30_a_task_group_and_4_of_each_mt_bench_category(tmp_path):
    rows = [{"question_id": i, "category": c, "turns": ["q"]} for i, c in enumerate(["writing"] * 10 + ["qa"] * 80)]
    src = tmp_path / "eval"
    src.mkdir()
    (src / "spec_bench_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (src / "mt_bench_question.jsonl").write_text(json.dumps(rows[0]) + "\n")
    sb, mt = lease.cut_eval(src, tmp_path / "cut")
    cats = [json.loads(x)["category"] for x in sb.read_text().splitlines()]
    assert cats.count("writing") == 4 and cats.count("qa") == 30
    assert lease_render.task_group("writing") == "mt_bench" and lease_render.task_group("qa") == "qa"


@pytest.mark.engine
def test_the_dry_run_runs_every_leg_of_the_queue_on_the_cpu_engine(tmp_path, engine):
    dest = lease.dry_run(tmp_path / "work", EVAL, results=tmp_path / "results")[0]
    log = json.loads((dest / "lease-log.json").read_text())
    _, legs = lease.load_plan()
    assert {leg["name"]: leg["rc"] for leg in log["legs"]} == {leg.name: 0 for leg in legs}
    cost = lease_render.cost_table(dest / "baseline-real" / "cost-table.txt")
    assert {0, 1, 3} <= set(cost) and cost[1] > 0
    s47 = dest / "standin-47"
    assert json.loads((s47 / "inspect.json").read_text())["pairing"]["ok"] is True
    assert json.loads((s47 / "run.json").read_text())["budget"] == 5
    rows = lease_render.summaries(s47 / "bench.jsonl")
    assert {r["budget"] for r in rows} == {None, 5, 15} and lease_render.label(rows) == "SYNTHETIC"
    sb = lease_render.summaries(dest / "specbench-methods" / "bench.jsonl", grouped=True)
    assert {r["category"] for r in sb} == {"mt_bench", *lease_render.SPEC_BENCH_GROUPS, "all"}
    assert {r["config"].split("@")[0] for r in sb} >= {"plain", "ngram-mod", "ngram-mod+dspark"}
    assert json.loads((dest / "choice-kit" / "tune.json").read_text())["choices"]
    text = lease_render.render(tmp_path / "results")
    for leg in legs:
        assert f"| {leg.name} | 0 |" in text
    assert "Spec-Bench task groups" in text and "within 3 %" in text
