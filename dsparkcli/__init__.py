"""dspark: speculative decoding with DSpark block-diffusion drafts on llama.cpp."""

# The one place the version is written (pyproject.toml reads it from here): importlib.metadata would
# cost every command ~20 ms of start-up to find the same string.
__version__ = "0.1.0"

__all__ = ["__version__", "run"]


def run(prompt, images=(), **options):  # type: ignore[no-untyped-def]
    """Answer one prompt through DSpark speculative decoding; see ``dsparkcli.runner.run``.

    Returns a frozen ``RunResult`` (text, tokens, timings, acceptance).
    """
    # deferred: `import dsparkcli` (every `dspark --version`, every script reading __version__) stays
    # standard-library only; runner pulls in the hub, httpx and the rest
    from dsparkcli.runner import run as _run

    return _run(prompt, images, **options)
