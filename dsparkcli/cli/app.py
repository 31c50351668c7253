"""The `dspark` command: one Typer app, one module per command, one error table."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException

from dsparkcli import __version__
from dsparkcli.cli import _common, _errors
from dsparkcli.errors import UsageError

# Each module defines ``register(app)``. Keep this list in the order `--help` should show.
COMMAND_MODULES = (
    "run",
    "bench",
    "tune",
    "serve",
    "rpc_worker",
    "synth",
    "distill",
    "requant",
    "fetch",
    "models",
    "inspect",
    "doctor",
    "engine",
)

HELP = """Speculative decoding with DSpark drafts on llama.cpp.

\b
Examples:
  dspark doctor                         # which llama.cpp, and can it run DSpark?
  dspark engine build --backend cuda    # build llama.cpp with DSpark support
  dspark fetch minicpm-v-4.7            # target + mmproj + draft, sha256-verified
  dspark run photo.png "Describe this"  # answer + acceptance stats
  dspark bench --budget 5 15            # plain vs budgets, side by side
  dspark tune --model minicpm-v-4.7     # the budget for this machine; then --budget auto
  dspark inspect draft.gguf             # census, DSpark structure, pairing
"""

SERVING = ("run", "serve", "bench", "tune")  # the commands that pass the arguments after `--` to llama-server

# Commands a module registers besides the one named after it (or under another spelling).
EXTRA_COMMANDS = {"synth-predict": "synth", "rpc-worker": "rpc_worker"}


def _new_app() -> typer.Typer:
    return typer.Typer(
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _version_callback(value: bool) -> None:
    if value:
        print(f"dspark {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Speculative decoding with DSpark drafts on llama.cpp."""


def build_app(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The app with these command modules registered (all of them for the root help and the tests)."""
    new = _new_app()
    new.callback()(_root)
    for name in modules:
        importlib.import_module(f"dsparkcli.cli.{name}").register(new)
    return new


def _module_for(args: list[str]) -> str | None:
    """The one command module that ``args`` invoke (the root takes no option with a value), else None."""
    for arg in args:
        if not arg.startswith("-"):
            name = EXTRA_COMMANDS.get(arg, arg)
            return name if name in COMMAND_MODULES else None
    return None


def __getattr__(name: str) -> typer.Typer:
    # `from dsparkcli.cli.app import app`: the whole app, built on first use (main() imports only the
    # command module it runs, which keeps start-up short)
    if name == "app":
        return build_app()
    raise AttributeError(name)


_INTERRUPTED: list[int] = []  # signals received; typer turns the KeyboardInterrupt into a quiet exit 130


def _interrupt(signum: int, frame: object) -> None:
    # SIGINT and SIGTERM unwind the stack like Ctrl-C, so every LlamaServer context manager stops its
    # child in order; remember it, so the user is told why dspark stopped
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


EXIT_PIPE = 141  # as a tool killed by SIGPIPE: the reader (`| head`) has quit


def _stdout_gone() -> int:
    # the reader closed the pipe: point stdout at /dev/null so the interpreter's last flush is silent too
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE


def _reader_quit(exc: SystemExit) -> bool:
    """Whether this exit is typer's for a write to a closed pipe (its `except OSError` turns EPIPE into exit
    1, the OSError as the exit's context) and the pipe is stdout's: a pipe's write end polls POLLERR once its
    reader has gone, so a socket's EPIPE (a server that died) stays an error."""
    cause = exc.__context__
    if not (isinstance(cause, OSError) and cause.errno == errno.EPIPE):
        return False
    import select  # a builtin: here, not at start-up

    try:
        poller = select.poll()
        poller.register(1, 0)  # POLLERR is reported whatever is asked for
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the exit code (also via SystemExit)."""
    for name in ("stdout", "stderr"):  # started with `>&-`: Python has no stream at all; write to nowhere
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - for the life of the process
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started with SIGINT ignored
        signal.signal(signal.SIGINT, _interrupt)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:  # everything after `--` goes to llama-server untouched (run, serve, bench)
        cut = args.index("--")
        _common.PASSTHROUGH[:] = args[cut + 1 :]
        args = args[:cut]
    if args in (["--version"], ["-V"]):
        print(f"dspark {__version__}")
        sys.exit(0)
    module = _module_for(args)
    if _common.PASSTHROUGH and module not in SERVING:
        sys.exit(_errors.report(UsageError(f"arguments after `--` go to llama-server: only {', '.join(SERVING)} start one")))
    app = build_app((module,) if module else COMMAND_MODULES)
    reported = False
    try:
        result = app(args=args, prog_name="dspark", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        sys.stdout.flush()  # inside the try: a reader that quit shows here
    except BrokenPipeError:
        code, reported = _stdout_gone(), True
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        code, reported = _errors.report(KeyboardInterrupt()), True
    except TyperException as e:  # click's usage errors: one line like every other error, exit 2
        code = getattr(e, "exit_code", 2)
        # bare `dspark` (or `dspark engine`): the help itself, on stderr with exit 2 as click and `hf` show it,
        # not folded into an error line (typer vendors click: the class is matched by name, as typer does)
        if type(e).__name__ == "NoArgsIsHelpError" and hasattr(e, "show"):
            e.show()
        else:
            ctx = getattr(e, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = e.format_message() if hasattr(e, "format_message") else str(e)
            print(f"dspark: error: {' '.join(message.split())}{where}", file=sys.stderr)
    except SystemExit as e:  # a reader that quit while the command streamed (`run ... | head -1`): as above
        if not _reader_quit(e):
            raise
        code, reported = _stdout_gone(), True
    except BaseException as e:  # noqa: BLE001 - the table decides what is expected; the rest re-raises
        code, reported = _errors.report(e), True
    if _INTERRUPTED and code == _errors.EXIT_INTERRUPTED and not reported:
        _errors.report(KeyboardInterrupt())  # typer turned the interrupt into exit 130 and said nothing
    sys.exit(code)


if __name__ == "__main__":
    main()
