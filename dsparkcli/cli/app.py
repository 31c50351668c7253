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
        add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
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


# What the root listing (`dspark --help`, bare `dspark`, an unknown command) shows of each command: its name
# and its help's first paragraph, in COMMAND_MODULES order. Written here so the listing imports no command
# module (each brings its share of the core: `--help` took ~0.5 s); tests/test_startup.py checks that the
# listing equals the one the registered commands give.
LISTING = (
    ("run", "Answer a prompt (optionally about images) with DSpark speculative decoding."),
    ("bench", "Benchmark plain decoding against DSpark drafts at several budgets, on a prompt kit."),
    ("tune", "Choose --budget (and --p-min) for a pair on this machine from a measured cost model."),
    ("serve", "Serve a target + DSpark draft (+ vision projector) until Ctrl-C or SIGTERM."),
    ("rpc-worker", "Lend this machine's devices to a llama-server elsewhere: run an RPC worker until Ctrl-C."),
    ("synth", "Write a synthetic target/draft pair whose every draft outcome is known in advance."),
    ("synth-predict", "Predict the tokens and draft counters llama-server reports on a synthetic pair."),
    ("distill", "Train a DSpark draft for a GGUF target (llama, qwen3) and write it as a GGUF llama.cpp serves."),
    ("requant", "Change the type of a draft's heads (markov_w1, markov_w2, fc) and nothing else, verified."),
    ("fetch", "Download a model pair from the Hugging Face hub and verify it (size and sha256)."),
    ("models", "List the model pairs dspark knows and what is already downloaded."),
    ("inspect", "Inspect GGUF files from their headers: tensor census, metadata, DSpark structure, pairing."),
    ("doctor", "Show the llama.cpp engine dspark uses and what it can do and load."),
    ("engine", "Build or locate the llama.cpp engine."),
)


def _listed() -> None:
    """A command as the root listing shows it (never run: main() builds the real one to run it)."""


def listing_app() -> typer.Typer:
    """The app as the root listing needs it: every command's name and summary, no command module."""
    new = _new_app()
    new.callback()(_root)
    for name, summary in LISTING:
        new.command(name, help=summary)(_listed)
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
    # also when started with SIGINT ignored (a background job of a script, `nohup make test &`): a SIGINT
    # that reaches dspark stops it and the servers it started, in order, instead of leaving them running
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
        sys.exit(
            _errors.report(UsageError(f"arguments after `--` go to llama-server: only {', '.join(SERVING)} start one"))
        )
    # a shell asking for completions (the script --install-completion wrote sets _DSPARK_COMPLETE): every
    # command module, so a command's options complete too; the words come from the environment, not args
    completing = bool(os.environ.get("_DSPARK_COMPLETE"))
    app = build_app() if completing else build_app((module,)) if module else listing_app()
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
