"""The tree keeps its shape (docs/DESIGN.md): one place for llama.cpp's protocol, floors without loops,
a core that never imports the CLI, light modules that stay light, modules of a readable size."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import REPO

PACKAGE = REPO / "dsparkcli"
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(REPO / "scripts").glob("*.py")])
# the modules DESIGN.md names as one job each, above ~500 lines
LONG_BUT_ONE_JOB = {"gguf/analysis.py", "synth/known_answer.py", "synth/full_width.py"}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _holders(pattern: str) -> set[str]:
    return {str(p.relative_to(REPO)) for p in SOURCES if re.search(pattern, p.read_text(encoding="utf-8"))}


@pytest.mark.parametrize(
    "what,pattern",
    [
        ("spec-decode metric names", r"llamacpp:spec_decode"),
        ("image data-URL builder", r"data:[^\"']*;base64,|\"data:\"|;base64,"),
        ("default budget", r"DEFAULT_BUDGET\s*="),
    ],
)
def test_llama_protocol_is_written_once(what, pattern):
    assert _holders(pattern) == {"dsparkcli/llama/protocol.py"}, what


def _dspark_imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-top imports, imports inside functions) of dspark's own modules."""
    top, inner = set(), set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dsparkcli":
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "dsparkcli"]
        known = [
            n
            for n in names
            if (PACKAGE.parent / (n.replace(".", "/") + ".py")).is_file()
            or (PACKAGE.parent / n.replace(".", "/") / "__init__.py").is_file()
        ]
        (top if id(node) in module_level or getattr(node, "col_offset", 1) == 0 else inner).update(known)
    return top, inner


def test_floors_have_no_loops_and_the_core_never_imports_the_cli():
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        top, inner = _dspark_imports(path)
        graph[name] = top - {name, "dsparkcli"}
        if not name.startswith("dsparkcli.cli"):
            assert not any(m.startswith("dsparkcli.cli") for m in top | inner), name
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"^\s*(import|from) (typer|rich)\b", text, re.M), name
        if name == "dsparkcli.cli.distill":  # the training wing needs torch, an optional extra (DESIGN.md)
            inner = {m for m in inner if not m.startswith("dsparkcli.distill")}
        # the deferred imports (DESIGN.md): dsparkcli.run -> runner; the console script's dsparkcli.cli.main ->
        # cli.app, after `--version` has answered
        if name not in ("dsparkcli", "dsparkcli.cli"):
            assert not inner, f"{name} imports {sorted(inner)} inside a function"
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        assert name not in stack, "import loop: " + " -> ".join((*stack, name))
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, (*stack, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def test_light_modules_need_only_the_standard_library():
    """`import dsparkcli` (every --version), the protocol/records/stats trio and the budget's pure modules import
    nothing heavy (and budget.limits, which cli._common parses --budget with, nothing but the standard library)."""
    code = (
        "import sys, json; import dsparkcli, dsparkcli.llama.protocol, dsparkcli.bench.records, "
        "dsparkcli.bench.stats, dsparkcli.budget.model, dsparkcli.budget.rule, dsparkcli.budget.key, "
        "dsparkcli.budget.record, dsparkcli.budget.limits; "
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    loaded = set(
        json.loads(
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
        )
    )
    assert not loaded & {
        "httpx",
        "httpx2",
        "huggingface_hub",
        "numpy",
        "platformdirs",
        "typer",
        "rich",
        "gguf",
        "PIL",
        "matplotlib",
    }


def test_no_module_is_a_novel():
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        n = len(path.read_text(encoding="utf-8").splitlines())
        assert n <= (600 if rel in LONG_BUT_ONE_JOB else 500), f"{rel}: {n} lines"


@pytest.mark.study  # imports study/gpu_sweep.py in a child python
def test_the_gpu_sweep_imports_without_dsparks_dependencies():
    """study/gpu_sweep.py --phase hbm runs with the GPU machine's own python (torch, no carried wheels): its
    imports must not need platformdirs (the H200 run of 2026-12-01 lost its HBM figure to that)."""
    code = (
        "import sys; sys.modules['platformdirs'] = None; import study.gpu_sweep; "
        "from dsparkcli import config; import os; os.environ.pop('DSPARK_CACHE_DIR', None); "
        "config.cache_dir()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode != 0 and "import of platformdirs halted" in proc.stderr  # only where it is used
    ok = subprocess.run(
        [sys.executable, "-c", code.rsplit(";", 1)[0]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert ok.returncode == 0, ok.stderr[-1500:]
