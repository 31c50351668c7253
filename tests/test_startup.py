"""Start-up time: `dspark --version`, `--help` and every command's own start-up, against `python -c pass`.

Measured as CPU time (user + system) of the child, best of several runs: on a loaded machine the wall
clock waits for other processes, CPU time does not. The thresholds are ratios to the same machine's
`python -c pass` (about 16 ms here; `--version` was 27x and `--help` 28x before heavy imports were
deferred to the commands that use them, now about 3x and 12x).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from support.cli import REPO

from dsparkcli.cli.app import COMMAND_MODULES, EXTRA_COMMANDS

RUNS = 5


def _cpu_seconds(*args: str) -> float:
    best = float("inf")
    for _ in range(RUNS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, *args], capture_output=True, check=False, cwd=REPO)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return best


@pytest.fixture(scope="module")
def python_pass() -> float:
    return max(_cpu_seconds("-c", "pass"), 0.005)


# (argv, at most this many times `python -c pass`): --version prints a string; --help and a command's own
# start-up may import typer and that command's modules, but not the hub client, httpx, numpy or rich.progress
CASES = [(("--version",), 8), (("--help",), 18)] + [
    ((name, "--help"), 20) for name in (*COMMAND_MODULES, *EXTRA_COMMANDS)
]


@pytest.mark.parametrize(("argv", "ratio"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_start_up_is_a_small_multiple_of_python_itself(argv, ratio, python_pass):
    took = _cpu_seconds("-m", "dsparkcli.cli.app", *argv)
    assert took <= ratio * python_pass, f"dspark {' '.join(argv)}: {took:.3f} s CPU = {took / python_pass:.1f}x python"


# huggingface_hub.constants (a few ms: where the HF cache is) is fine; its API client and HTTP stack are not
HEAVY = {"httpx", "httpx2", "huggingface_hub.hf_api", "huggingface_hub.errors", "numpy", "gguf", "PIL", "matplotlib",
         "rich.progress"}  # (typer itself brings pydantic once a command is built)


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("run", "--help"), ("inspect", "--help"),
                                  ("models",), ("synth", "--help"), ("bench", "--help")])
def test_help_and_listing_import_nothing_heavy(argv):
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
            f"sys.argv = ['dspark', *{list(argv)!r}]\n"
            "from dsparkcli.cli.app import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    loaded |= {m.split(".")[0] for m in loaded}
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
