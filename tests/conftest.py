"""Shared fixtures. Integration tests use the real llama.cpp engine that `make engine` builds."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.engine import Engine
from support.cli import run_cli, run_cli_in_process
from support.registry import write_user_models


def pytest_configure(config: pytest.Config) -> None:
    # Tests isolate dspark's cache with DSPARK_CACHE_DIR, which roots the engine builds too; an engine dir set
    # apart (DSPARK_ENGINE_DIR) would survive that isolation, and a test that builds into its own cache would
    # build into (and overwrite the record of) the user's engine instead. It happened here once.
    if os.environ.get("DSPARK_ENGINE_DIR"):
        pytest.exit(
            "unset DSPARK_ENGINE_DIR to run the tests: they isolate the engine through DSPARK_CACHE_DIR "
            "(`make test` builds or reuses the engine under the default cache)",
            returncode=2,
        )
    if "not engine" in (config.option.markexpr or ""):
        hide_engine(config)


def hide_engine(config: pytest.Config) -> None:
    """A run that leaves the engine lane out (`make test-fast`) runs as a newcomer's machine before `make
    engine`: no cached build (an empty DSPARK_CACHE_DIR), no config naming one, no DSPARK_LLAMA_BIN. A test that
    needs the engine without being marked then fails there, instead of passing wherever one happens to be built."""
    empty = Path(tempfile.mkdtemp(prefix="dspark-no-engine-"))
    config.add_cleanup(lambda: shutil.rmtree(empty, ignore_errors=True))
    os.environ.update(DSPARK_CACHE_DIR=str(empty / "cache"), DSPARK_CONFIG_DIR=str(empty / "config"))
    os.environ.pop("DSPARK_LLAMA_BIN", None)


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real llama-server build. A missing engine is a failure, not a skip: `make test` builds it."""
    return engine_mod.describe(engine_mod.resolve_engine())


# the lanes whose CLI calls may start llama-server or time themselves: those get a real `dspark` process
SUBPROCESS_LANES = {"engine", "timing"}


@pytest.fixture
def cli(request: pytest.FixtureRequest):
    """``cli(*args, env=, timeout=, cwd=, input=)`` -> CompletedProcess: `dspark ARGS` as a user runs it. A test
    that starts no engine runs it in this process (the same code, without a new interpreter each time); an
    engine or timing test, or a call that sets an environment read at import, gets a subprocess."""
    if os.environ.get("DSPARK_TEST_CLI") == "subprocess" or any(
        m.name in SUBPROCESS_LANES for m in request.node.iter_markers()
    ):
        return run_cli
    return run_cli_in_process


@pytest.fixture
def user_models(tmp_path: Path) -> Callable[[str], Path]:
    """``user_models(TOML)`` writes the user's models.toml into ``<tmp>/cfg`` and returns that folder, for
    DSPARK_CONFIG_DIR: the one registry fixture (every test that adds pairs goes through it)."""
    return lambda toml: write_user_models(tmp_path / "cfg", toml)


# Test lanes (issue 29; `make test-fast` runs none of these, `make test` runs all). Marked here from what a
# test can be seen to use, so a new test lands in its lane without anyone remembering to mark it:
# - engine: uses the `engine` fixture, or a fixture that depends on it (fixturenames is the closure), or the
#   pinned llama.cpp source that `make engine` downloads and unpacks (SOURCE_TREE: 290 MB a newcomer lacks);
# - study: runs or imports the study kit in study/ (support.scripts.script or run_script, a "study/..." path or
#   "study.<name>" module, a module-level study module);
# - torch: its module imports torch, or its code names torch;
# - timing: never automatic (a wall-clock bound is not visible in the code's names): marked by hand.
# What detection cannot see is marked by hand: @pytest.mark.engine on a test whose CLI call starts
# llama-server without the fixture. A run with -m 'not engine ...' finds no engine (hide_engine), so such a
# test fails there instead of silently running the engine in the fast lane.


SOURCE_TREE = {"vendored_source", "vendored_source_dir", "sdist_tree", "sdist_tree_dir"}  # llama.sources' names


def _functions_used(fn: Callable, module: types.ModuleType | None, seen: set) -> Iterator[Callable]:
    """``fn`` and, transitively, the functions of the test's own module that its code calls by name."""
    if fn in seen:
        return
    seen.add(fn)
    yield fn
    code = getattr(fn, "__code__", None)
    if code is None or module is None:
        return
    for name in _code_names(code):
        other = getattr(module, name, None)
        if inspect.isfunction(other) and other.__module__ == module.__name__:
            yield from _functions_used(other, module, seen)


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # lambdas, comprehensions, nested functions
            names |= _code_names(const)
    return names


def _code_strings(code: types.CodeType, doc: str | None) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_strings(const, None)
        elif isinstance(const, str) and const is not doc:  # a docstring names a script without running it
            yield const


def _runs_scripts(fn: Callable) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    if {"script", "run_script", "study"} & set(code.co_names):  # support.scripts.script("name"), `from study ...`
        return True
    return any(s == "study" or s.startswith(("study/", "study.")) for s in _code_strings(code, fn.__doc__))


def _lanes(item: pytest.Item) -> set[str]:
    lanes = set()
    if "engine" in getattr(item, "fixturenames", ()):
        lanes.add("engine")
    module = getattr(item, "module", None)
    if module is not None and isinstance(getattr(module, "torch", None), types.ModuleType):
        lanes.add("torch")
    if module is not None and any(
        isinstance(v, types.ModuleType) and v.__name__.startswith("study.") for v in vars(module).values()
    ):
        lanes.add("study")  # a study module at module level (profile = script("kernel_profile"))
    roots = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        roots += [d.func for d in defs if getattr(d.func, "__module__", "") == getattr(module, "__name__", None)]
    seen: set = set()
    for root in filter(None, roots):
        for fn in _functions_used(root, module, seen):
            if _runs_scripts(fn):
                lanes.add("study")
            if "torch" in _code_names(fn.__code__):
                lanes.add("torch")
            if SOURCE_TREE & _code_names(fn.__code__):
                lanes.add("engine")
    return lanes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for lane in sorted(_lanes(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, lane))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A run without the torch lane does not import a module that imports torch (~1.2 s CPU) only to deselect
    all of it: such a module is in the torch lane whole (_lanes)."""
    if collection_path.suffix != ".py" or "not torch" not in (config.option.markexpr or ""):
        return None
    return True if re.search(r"^(import torch|from torch[ .])", collection_path.read_text(), re.M) else None
