"""dspark: speculative decoding with DSpark block-diffusion drafts on llama.cpp."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("dspark")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.1.0"

__all__ = ["__version__", "run"]


def run(prompt, images=(), **options):  # type: ignore[no-untyped-def]
    """Answer one prompt through DSpark speculative decoding; see ``dsparkcli.runner.run``.

    Returns a frozen ``RunResult`` (text, tokens, timings, acceptance).
    """
    from dsparkcli.runner import run as _run

    return _run(prompt, images, **options)
