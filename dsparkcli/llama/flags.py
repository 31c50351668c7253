"""The llama-server flags dspark owns, and the arguments passed through after ``--``. Standard library only:
every command's start-up (cli/_common) checks the passthrough with it, without importing llama.server."""

from __future__ import annotations

from dsparkcli.errors import UsageError
from dsparkcli.llama.speculation import owned_flags as _spec_flags

# llama-server flags that ServerConfig writes itself, and the dspark option that sets each. Given again in
# extra_args (after `--` on the command line) llama-server would take the last one, and dspark's checks
# would describe another server than the one running: loopback and the API key (--host), the port it
# waits on, the pairing of the files it read (-m, -md, --mmproj), the budget and context it validated.
OWNED_FLAGS: dict[str, str] = {
    **dict.fromkeys(("--host",), "--host (dspark serve; run and bench bind 127.0.0.1)"),
    **dict.fromkeys(("--port",), "--port (dspark serve; run and bench take a free port)"),
    **dict.fromkeys(
        ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"),
        "--target (a path or hf://owner/repo/file.gguf)",
    ),
    **dict.fromkeys(
        ("-md", "--model-draft", "--spec-draft-model", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
        "--draft",
    ),
    **dict.fromkeys(("-mm", "--mmproj", "-mmu", "--mmproj-url", "--no-mmproj", "--no-mmproj-auto"), "--mmproj"),
    **dict.fromkeys(("--api-key", "--api-key-file"), "--api-key-file or DSPARK_API_KEY"),
    **dict.fromkeys(("--spec-type",), "--spec (dspark, ngram-mod, ngram-simple, draft-simple) or --no-draft"),
    **_spec_flags(),  # the n-gram flags --spec sets: --spec ngram-mod:n_max=8
    **dict.fromkeys(("--spec-draft-n-max", "--draft", "--draft-n", "--draft-max", "--spec-cost-table"), "--budget"),
    **dict.fromkeys(("--spec-draft-p-min", "--draft-p-min"), "--p-min"),
    **dict.fromkeys(("--spec-synth-len",), "--synth-len (dspark bench)"),
    **dict.fromkeys(("-c", "--ctx-size"), "--ctx"),
    **dict.fromkeys(("-np", "--parallel"), "--parallel (dspark serve; bench --concurrency)"),
}


def split_server_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(a script's own arguments, the llama-server arguments after the first ``--``)."""
    if "--" not in argv:
        return list(argv), []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def check_extra_args(args: tuple[str, ...] | list[str]) -> None:
    """Refuse a flag of OWNED_FLAGS among the extra llama-server arguments, naming dspark's option."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise UsageError(
                f"{flag} after `--` would override what dspark checked and reports: use {OWNED_FLAGS[flag]}"
            )
