"""llama.building: a second build of the same engine waits for the first (the lock), and the build's
progress lines are read as percentages."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsparkcli.errors import EngineBuildError
from dsparkcli.llama import building

HOLD = """
import fcntl, os, sys, time
f = open(sys.argv[1], "a+"); fcntl.flock(f, fcntl.LOCK_EX); f.seek(0); f.truncate(); f.write(str(os.getpid())); f.flush()
print("held", flush=True); time.sleep(float(sys.argv[2]))
"""


def test_a_second_build_of_the_same_engine_waits_for_the_first(tmp_path: Path) -> None:
    root = tmp_path / "0c1e570-cpu-x86-64-v3-rpc-pabc"
    root.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root / ".build.lock"), "1.5"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    said: list[str] = []
    t0 = time.monotonic()
    with building.build_lock(root, lambda pct, line: said.append(line)):
        waited = time.monotonic() - t0
        assert (root / ".build.lock").read_text() == str(__import__("os").getpid())
    assert holder.wait(timeout=10) == 0
    assert waited >= 1.0, waited  # it did not build under the other one
    assert said == [f"waiting for another dspark engine build of {root.name} (pid {holder.pid})"]
    with building.build_lock(root, lambda pct, line: said.append(line)):  # free now: no wait, nothing said
        pass
    assert len(said) == 1


def test_steps_are_logged_with_their_progress_and_a_failure_is_one_line(tmp_path: Path) -> None:
    seen: list[tuple[float, str]] = []
    log = tmp_path / "build.log"
    building.run_steps(
        [["echo", "configured"], [sys.executable, "-c", "print('[1/4] a'); print('[ 50%] b')"]],
        log,
        lambda pct, line: seen.append((pct, line)),
    )
    assert seen == [(-1.0, "configured"), (25.0, "[1/4] a"), (50.0, "[ 50%] b")]
    assert log.read_text().splitlines()[0] == "$ echo configured"
    with pytest.raises(EngineBuildError) as e:
        building.run_steps([["true"], [sys.executable, "-c", "print('oops'); raise SystemExit(3)"]], log)
    assert e.value.message == "build failed (rc 3): oops" and str(log) in (e.value.hint or "")
    # the H200's failure: cmake's error line, then ninja's progress of other jobs, then the stop
    script = (
        "print('[258/376] Building a.o'); print('CMake Error: Not a file: /s/scripts/ui-assets.cmake'); "
        "print('[259/376] Building b.o'); print('ninja: build stopped: subcommand failed.'); raise SystemExit(1)"
    )
    with pytest.raises(EngineBuildError) as e:
        building.run_steps([["true"], [sys.executable, "-c", script]], log)
    assert e.value.message == "build failed (rc 1): CMake Error: Not a file: /s/scripts/ui-assets.cmake"
