"""dspark: speculative decoding with DSpark block-diffusion drafts on llama.cpp."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("dspark")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.1.0"

__all__ = ["__version__"]
